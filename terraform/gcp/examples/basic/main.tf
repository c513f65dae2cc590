# One ps, two workers and a chief on Compute Engine, SSH from one office network. tfcluster writes an
# equivalent root under .tfcluster/<cluster>/terraform/ (`make up PROVIDER=gcp`); this file shows the
# module on its own. Credentials: `gcloud auth application-default login` (nothing here is secret).

module "cluster" {
  source = "../.."

  cluster_name        = "exp1"
  ps_count            = 1
  worker_count        = 2
  chief_count         = 1
  instance_types      = { ps = "", worker = "n1-standard-8", chief = "" }
  images              = {}
  gpus                = { ps = 0, worker = 1, chief = 0 }
  ssh_public_key      = file(pathexpand("~/.ssh/id_ed25519.pub"))
  ssh_user            = ""
  allowed_ssh_cidrs   = ["203.0.113.0/24"]
  tf_port             = 2222
  bucket              = "my-tfcluster-runs"
  prefix              = "runs"
  max_runtime_minutes = 120
  # What the nodes' service account may use (tfcluster/access.py computes it): ps VMs run without one.
  storage_access = {
    jobs       = ["worker", "chief"]
    read_write = "runs/exp1/"
    read       = [{ bucket = "my-tfcluster-runs", prefix = "datasets/digits-" }]
  }

  provider_options = {
    project  = "my-project-123"
    zone     = "europe-west4-a"
    gpu_type = "nvidia-tesla-t4"
  }
}

output "nodes" {
  description = "name, role, index, private_ip, public_ip, ssh_user, ssh_port, gpus of every node."
  value       = module.cluster.nodes
}
