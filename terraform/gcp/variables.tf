# The shared interface: every provider module under terraform/ declares exactly these inputs
# (tests/unit/test_terraform_interface.py checks it). GCP-specific settings travel in provider_options.
# No variable carries a credential: Terraform authenticates with Application Default Credentials.

variable "cluster_name" {
  description = "Cluster name; instance, firewall, network and service-account names derive from it."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,18}[a-z0-9]$", var.cluster_name)) && !strcontains(var.cluster_name, "--")
    error_message = "cluster_name: 2-20 characters, lowercase letters, digits and '-', starting with a letter, not ending with '-', no '--'."
  }
}

variable "ps_count" {
  description = "Number of parameter-server nodes."
  type        = number
  validation {
    condition     = var.ps_count >= 0 && var.ps_count <= 32 && var.ps_count == floor(var.ps_count)
    error_message = "ps_count: a whole number from 0 to 32."
  }
}

variable "worker_count" {
  description = "Number of worker nodes."
  type        = number
  validation {
    condition     = var.worker_count >= 0 && var.worker_count <= 64 && var.worker_count == floor(var.worker_count)
    error_message = "worker_count: a whole number from 0 to 64."
  }
}

variable "chief_count" {
  description = "Number of chief nodes (0 or 1)."
  type        = number
  validation {
    condition     = contains([0, 1], var.chief_count)
    error_message = "chief_count: 0 or 1."
  }
}

variable "instance_types" {
  description = "Machine type per role (ps, worker, chief); '' or absent means the module's default (e2-standard-4 for ps and chief, e2-standard-8 for workers, n1-standard-8 for a role with GPUs)."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.instance_types) : contains(["ps", "worker", "chief"], k)])
    error_message = "instance_types: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for v in values(var.instance_types) : v == "" || can(regex("^[a-z][a-z0-9]*-[a-z0-9-]+$", v))])
    error_message = "instance_types: '' (the default) or a Compute Engine machine type such as e2-standard-4, n1-standard-8 or a2-highgpu-1g."
  }
}

variable "images" {
  description = "Boot image per role: an image name, family path (debian-cloud/debian-12) or self link; '' or absent means the latest Debian 12 (family debian-12 of debian-cloud, Python 3.11)."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.images) : contains(["ps", "worker", "chief"], k)])
    error_message = "images: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for v in values(var.images) : v == "" || can(regex("^[A-Za-z0-9][A-Za-z0-9/_.:-]*$", v))])
    error_message = "images: '' (Debian 12) or an image name, family path or self link (letters, digits, '/', '_', '.', ':', '-')."
  }
}

variable "gpus" {
  description = "GPUs per node, per role: guest accelerators of type provider_options.gpu_type on N1 machine types, or the GPU count that an accelerator-optimized machine type (a2-, a3-, a4-, g2-, g4-) comes with."
  type        = map(number)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.gpus) : contains(["ps", "worker", "chief"], k)])
    error_message = "gpus: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for g in values(var.gpus) : contains([0, 1, 2, 4, 8, 16], g)])
    error_message = "gpus: 0, 1, 2, 4, 8 or 16 per node (the counts Compute Engine attaches)."
  }
}

variable "ssh_public_key" {
  description = "The run's SSH public key (OpenSSH format), the only key authorised on every node (metadata ssh-keys for ssh_user; project-wide keys are blocked)."
  type        = string
  validation {
    condition     = can(regex("^ssh-(ed25519|rsa) [A-Za-z0-9+/=]+( [^\n]*)?\n?$", var.ssh_public_key))
    error_message = "ssh_public_key: one OpenSSH public key line starting with ssh-ed25519 or ssh-rsa."
  }
}

variable "ssh_user" {
  description = "SSH user on the nodes, created by the guest agent from the ssh-keys metadata; '' means debian."
  type        = string
  default     = ""
  validation {
    condition     = var.ssh_user == "" || (can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user)) && var.ssh_user != "root")
    error_message = "ssh_user: '' (debian) or a Unix user name ([a-z_][a-z0-9_-]{0,31}) other than root."
  }
}

variable "allowed_ssh_cidrs" {
  description = "IPv4 networks allowed to reach SSH (tcp/22) on the nodes. Required: there is no open default."
  type        = list(string)
  default     = []
  validation {
    condition     = length(var.allowed_ssh_cidrs) > 0
    error_message = "allowed_ssh_cidrs: at least one CIDR block such as 203.0.113.0/24 (clouds have no open default)."
  }
  validation {
    condition     = alltrue([for c in var.allowed_ssh_cidrs : can(cidrnetmask(c))])
    error_message = "allowed_ssh_cidrs: IPv4 CIDR blocks such as 203.0.113.0/24 (nodes have IPv4 addresses only)."
  }
}

variable "tf_port" {
  description = "TensorFlow gRPC port, reachable only from the cluster's own instances (network tag)."
  type        = number
  default     = 2222
  validation {
    condition     = var.tf_port >= 1024 && var.tf_port <= 65535 && var.tf_port == floor(var.tf_port)
    error_message = "tf_port: a whole number from 1024 to 65535."
  }
}

variable "bucket" {
  description = "Existing Cloud Storage bucket of the run (uniform bucket-level access on: its grants carry IAM conditions); the nodes' service account may use storage_access.read_write in it."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket: a bucket name of 3-63 characters: lowercase letters, digits, '.', '_' and '-', starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix of the runs inside the bucket (recorded in instance metadata); storage_access.read_write lies under it."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$", var.prefix)) && !strcontains(var.prefix, "..")
    error_message = "prefix: letters, digits, '.', '_', '-', '/' (no leading '/', no '..'), at most 200 characters."
  }
}

variable "storage_access" {
  description = <<-EOT
    What the nodes' service account may do in Cloud Storage, computed by tfcluster (tfcluster/access.py):
    jobs, the roles whose VMs run as the account at all (tfcluster: worker and chief; ps nodes only hold variables);
    read_write, the key prefix in bucket of this cluster's runs (<prefix>/<cluster>/): roles/storage.objectUser on the objects under it and listings of it;
    read, the data the cluster trains on, as bucket and key prefix ('' = the whole bucket): roles/storage.objectViewer on those objects.
    Each grant is a bucket-level IAM member with an IAM condition on the object names.
  EOT
  type = object({
    jobs       = list(string)
    read_write = string
    read = list(object({
      bucket = string
      prefix = string
    }))
  })
  validation {
    condition     = alltrue([for j in var.storage_access.jobs : contains(["ps", "worker", "chief"], j)])
    error_message = "storage_access.jobs: roles: ps, worker, chief."
  }
  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._/-]*/$", var.storage_access.read_write)) && !strcontains(var.storage_access.read_write, "..") && !strcontains(var.storage_access.read_write, "//")
    error_message = "storage_access.read_write: a key prefix ending in '/' (<prefix>/<cluster>/): letters, digits, '.', '_', '-', '/', no '..' or '//'."
  }
  validation {
    condition = alltrue([for g in var.storage_access.read :
    can(regex("^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$", g.bucket)) && can(regex("^[A-Za-z0-9!_.'()/-]*$", g.prefix))])
    error_message = "storage_access.read: bucket names, and key prefixes of letters, digits and ! _ . ' ( ) / - only (an IAM condition names them as they are)."
  }
}

variable "max_runtime_minutes" {
  description = "Hard limit of a run, counted from the start of training. Backstop: every node powers off this many minutes plus a 60-minute configuration allowance after boot (startup script) and Compute Engine deletes it then (scheduling.max_run_duration, instance_termination_action DELETE); tfcluster's tf_node role halts it earlier, at the run's deadline plus a margin."
  type        = number
  validation {
    condition     = var.max_runtime_minutes >= 1 && var.max_runtime_minutes <= 10080 && var.max_runtime_minutes == floor(var.max_runtime_minutes)
    error_message = "max_runtime_minutes: a whole number from 1 to 10080 (7 days)."
  }
}

variable "provider_options" {
  description = "GCP settings (all strings): project (required), zone (us-central1-a), region (derived from zone), network and subnetwork (existing ones; '' = create a network), subnet_cidr (10.20.0.0/24, for a created network), service_account_email (existing one, granted nothing; '' = create one limited to storage_access), preemptible (false; true = Spot VMs), public_ip (true; false needs an existing network with Cloud NAT and network_has_nat true), network_has_nat (false), disk_size_gb (50), disk_type (pd-balanced), gpu_type (nvidia-tesla-t4)."
  type        = map(string)
  validation {
    condition = alltrue([for k in keys(var.provider_options) : contains([
      "project", "zone", "region", "network", "subnetwork", "subnet_cidr", "service_account_email",
      "preemptible", "public_ip", "network_has_nat", "disk_size_gb", "disk_type", "gpu_type",
    ], k)])
    error_message = "provider_options: known keys are project, zone, region, network, subnetwork, subnet_cidr, service_account_email, preemptible, public_ip, network_has_nat, disk_size_gb, disk_type, gpu_type."
  }
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", lookup(var.provider_options, "project", "")))
    error_message = "provider_options.project: required; a GCP project id (6-30 characters: lowercase letters, digits, '-', starting with a letter)."
  }
  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", lookup(var.provider_options, "zone", "us-central1-a")))
    error_message = "provider_options.zone: a Compute Engine zone such as us-central1-a or europe-west4-b."
  }
  validation {
    condition = (lookup(var.provider_options, "region", "") == "" ||
    startswith(lookup(var.provider_options, "zone", "us-central1-a"), "${lookup(var.provider_options, "region", "")}-"))
    error_message = "provider_options.region: '' (derived from zone) or the region of provider_options.zone (zone us-central1-a is in region us-central1)."
  }
  validation {
    condition     = alltrue([for k in ["preemptible", "public_ip", "network_has_nat"] : contains(["true", "false"], lookup(var.provider_options, k, "false"))])
    error_message = "provider_options.preemptible, public_ip and network_has_nat: true or false."
  }
  validation {
    condition     = lookup(var.provider_options, "public_ip", "true") == "true" || (lookup(var.provider_options, "network", "") != "" && lookup(var.provider_options, "network_has_nat", "false") == "true")
    error_message = "provider_options.public_ip: false only with an existing network that has Cloud NAT (network set, network_has_nat true): without an external address a VM reaches apt and PyPI only through NAT, and a created network has none."
  }
  validation {
    condition     = try(tonumber(lookup(var.provider_options, "disk_size_gb", "50")) >= 10 && tonumber(lookup(var.provider_options, "disk_size_gb", "50")) <= 65536 && tonumber(lookup(var.provider_options, "disk_size_gb", "50")) == floor(tonumber(lookup(var.provider_options, "disk_size_gb", "50"))), false)
    error_message = "provider_options.disk_size_gb: a whole number of GB from 10 to 65536."
  }
  validation {
    condition     = contains(["pd-standard", "pd-balanced", "pd-ssd", "hyperdisk-balanced"], lookup(var.provider_options, "disk_type", "pd-balanced"))
    error_message = "provider_options.disk_type: pd-standard, pd-balanced, pd-ssd or hyperdisk-balanced."
  }
  validation {
    condition     = can(cidrnetmask(lookup(var.provider_options, "subnet_cidr", "10.20.0.0/24")))
    error_message = "provider_options.subnet_cidr: an IPv4 CIDR block such as 10.20.0.0/24."
  }
  validation {
    condition     = (lookup(var.provider_options, "subnetwork", "") == "" || lookup(var.provider_options, "network", "") != "")
    error_message = "provider_options.subnetwork: needs provider_options.network too (the firewall rules attach to the network)."
  }
  validation {
    condition = alltrue([for k in ["network", "subnetwork"] :
    can(regex("^([A-Za-z0-9][A-Za-z0-9/_.:-]*)?$", lookup(var.provider_options, k, "")))])
    error_message = "provider_options.network and provider_options.subnetwork: '' or a name or self link (letters, digits, '/', '_', '.', ':', '-')."
  }
  validation {
    condition     = can(regex("^([a-z0-9._-]+@[a-z0-9.-]+\\.gserviceaccount\\.com)?$", lookup(var.provider_options, "service_account_email", "")))
    error_message = "provider_options.service_account_email: '' (create one) or a service account e-mail ending in .gserviceaccount.com."
  }
  validation {
    condition     = can(regex("^nvidia-[a-z0-9-]+$", lookup(var.provider_options, "gpu_type", "nvidia-tesla-t4")))
    error_message = "provider_options.gpu_type: a Compute Engine accelerator type such as nvidia-tesla-t4 or nvidia-l4."
  }
}
