# The smallest use of the module outside tfcluster: 1 ps, 2 workers, 1 chief in a new VPC of
# us-east-1, SSH only from one documentation network. Credentials come from the AWS standard chain
# (environment or ~/.aws); none appears here.
#
#   terraform init && terraform apply -var 'ssh_public_key=ssh-ed25519 AAAA... you@host'
#   terraform destroy -var 'ssh_public_key=...'
#
# tfcluster writes an equivalent root (.tfcluster/<cluster>/terraform/main.tf.json) itself.

variable "ssh_public_key" {
  description = "An OpenSSH public key authorised on every node."
  type        = string
}

module "cluster" {
  source = "../.."

  cluster_name        = "tfc-example"
  ps_count            = 1
  worker_count        = 2
  chief_count         = 1
  instance_types      = { worker = "c6i.large" } # ps and chief: the defaults (m6i.large)
  images              = {}                       # Debian 12 (official AMI)
  gpus                = {}
  ssh_public_key      = var.ssh_public_key
  ssh_user            = ""
  allowed_ssh_cidrs   = ["203.0.113.0/24"] # your address or VPN range
  tf_port             = 2222
  bucket              = "my-tfcluster-bucket"
  prefix              = "runs"
  max_runtime_minutes = 120
  # What the nodes' instance role may use: tfcluster/access.py computes it from the cluster file.
  storage_access = {
    jobs       = ["worker", "chief"]                                               # ps nodes get no role
    read_write = "runs/tfc-example/"                                               # <prefix>/<cluster>/
    read       = [{ bucket = "my-tfcluster-bucket", prefix = "datasets/digits-" }] # the data, read only
  }
  provider_options = {
    region = "us-east-1"
    spot   = "false"
  }
}

output "nodes" {
  description = "name, role, index, private_ip, public_ip, ssh_user, ssh_port, gpus of every node."
  value       = module.cluster.nodes
}
