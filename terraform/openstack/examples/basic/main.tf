# One ps, two workers (on a GPU flavor) and a chief on an OpenStack site, SSH from one office network.
# tfcluster writes an equivalent root under .tfcluster/<cluster>/terraform/ (`make up PROVIDER=openstack`);
# this file shows the module on its own. Credentials: the clouds.yaml entry named by `cloud`
# (passwords or application credentials in secure.yaml), never in this file.

module "cluster" {
  source = "../.."

  cluster_name        = "exp1"
  ps_count            = 1
  worker_count        = 2
  chief_count         = 1
  instance_types      = { ps = "", worker = "g1.xlarge.gpu", chief = "" }
  images              = {}
  gpus                = { ps = 0, worker = 1, chief = 0 }
  ssh_public_key      = file(pathexpand("~/.ssh/id_ed25519.pub"))
  ssh_user            = ""
  allowed_ssh_cidrs   = ["203.0.113.0/24"]
  tf_port             = 2222
  bucket              = "tfcluster"
  prefix              = "runs"
  max_runtime_minutes = 120
  # Ignored on OpenStack (tfcluster/access.py computes it): the site's S3 keys go to these jobs only.
  storage_access = {
    jobs       = ["worker", "chief"]
    read_write = "runs/exp1/"
    read       = [{ bucket = "tfcluster", prefix = "datasets/digits-" }]
  }

  provider_options = {
    cloud            = "mysite"
    external_network = "public"
    flavor           = "m1.large"
  }
}

output "nodes" {
  description = "name, role, index, private_ip, public_ip, ssh_user, ssh_port, gpus of every node."
  value       = module.cluster.nodes
}
