# The shared interface: every provider module under terraform/ declares exactly these inputs
# (tests/unit/test_terraform_interface.py checks it). Provider-specific settings travel in
# provider_options.

variable "cluster_name" {
  description = "Cluster name; node, host and resource names derive from it."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,18}[a-z0-9]$", var.cluster_name))
    error_message = "cluster_name: 2-20 characters, lowercase letters, digits and '-', starting with a letter."
  }
}

variable "ps_count" {
  description = "Number of parameter-server nodes."
  type        = number
  validation {
    condition     = var.ps_count >= 0 && var.ps_count == floor(var.ps_count)
    error_message = "ps_count: a whole number >= 0."
  }
}

variable "worker_count" {
  description = "Number of worker nodes."
  type        = number
  validation {
    condition     = var.worker_count >= 0 && var.worker_count == floor(var.worker_count)
    error_message = "worker_count: a whole number >= 0."
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
  description = "Instance type per role (ps, worker, chief); '' means the provider's default. Ignored by local."
  type        = map(string)
  default     = {}
}

variable "images" {
  description = "Image per role: the directory of a baked image's layer (tfcluster/baked.py), mounted read-only above the base image; '' means the bare base image."
  type        = map(string)
  default     = {}
}

variable "gpus" {
  description = "GPUs per node, per role."
  type        = map(number)
  default     = {}
  validation {
    condition     = alltrue([for g in values(var.gpus) : g == 0])
    error_message = "gpus: local nodes have no GPUs; every value must be 0."
  }
}

variable "ssh_public_key" {
  description = "The run's SSH public key (OpenSSH format), authorised on every node."
  type        = string
  validation {
    condition     = can(regex("^ssh-(ed25519|rsa) ", var.ssh_public_key))
    error_message = "ssh_public_key: an OpenSSH public key starting with ssh-ed25519 or ssh-rsa."
  }
}

variable "ssh_user" {
  description = "SSH user on the nodes; '' means the provider's default (the base image's user, debian, with sudo)."
  type        = string
  default     = ""
  validation {
    condition     = contains(["", "debian"], var.ssh_user)
    error_message = "ssh_user: '' or debian (the base image's user) on the local provider."
  }
}

variable "allowed_ssh_cidrs" {
  description = "Networks allowed to reach SSH. Local nodes are reachable only from this host's bridge."
  type        = list(string)
  default     = []
}

variable "tf_port" {
  description = "TensorFlow gRPC port, reachable only between cluster members."
  type        = number
  default     = 2222
  validation {
    condition     = var.tf_port >= 1024 && var.tf_port <= 65535
    error_message = "tf_port: 1024-65535."
  }
}

variable "bucket" {
  description = "S3 bucket of the run (clouds grant the nodes access to it alone)."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket))
    error_message = "bucket: an S3 bucket name, 3-63 characters of lowercase letters, digits, '.' and '-'."
  }
}

variable "prefix" {
  description = "Key prefix of the run inside the bucket."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._/-]*$", var.prefix)) && !strcontains(var.prefix, "..")
    error_message = "prefix: letters, digits, '.', '_', '-' and '/', no leading '/' and no '..'."
  }
}

variable "max_runtime_minutes" {
  description = "Hard limit of the run; nodes stop themselves after it."
  type        = number
  validation {
    condition     = var.max_runtime_minutes >= 1
    error_message = "max_runtime_minutes: >= 1."
  }
}

variable "storage_access" {
  description = "What the nodes may do in object storage (tfcluster/access.py): jobs, read_write, read. Ignored by local: its nodes use the local store's keys, which tfcluster puts on the nodes of storage_access.jobs only while their tasks run."
  type = object({
    jobs       = list(string)
    read_write = string
    read = list(object({
      bucket = string
      prefix = string
    }))
  })
}

variable "provider_options" {
  description = "Provider-specific settings. Local: python (interpreter with tfcluster), state_dir, subnet (CIDR), bridge, veth_prefix, netns_prefix and cgroup_parent (host-side names, from tfcluster), image_root (the base image's root file system), apt_cache_dir (the apt proxy's cache), ssh_timeout, store_ip (the only address beyond the bridge a node can reach); the user's option node_memory_mb (MiB, 256-65536; unset: no limit) limits each node's memory like a VM's RAM: all its processes share one memory cgroup <cgroup_parent>/<node> without swap."
  type        = map(string)
  default     = {}
  validation {
    condition = (alltrue([for k in ["python", "state_dir", "subnet", "bridge", "veth_prefix", "netns_prefix", "cgroup_parent", "image_root", "apt_cache_dir"] : contains(keys(var.provider_options), k)])
    && can(cidrhost(lookup(var.provider_options, "subnet", "x"), 1)))
    error_message = "provider_options: python, state_dir, subnet (a CIDR block), bridge, veth_prefix, netns_prefix, cgroup_parent, image_root and apt_cache_dir are required; ssh_timeout, store_ip and node_memory_mb are optional."
  }
  validation {
    condition     = try(tonumber(lookup(var.provider_options, "node_memory_mb", "256")) >= 256 && tonumber(lookup(var.provider_options, "node_memory_mb", "256")) <= 65536 && can(regex("^[0-9]+$", lookup(var.provider_options, "node_memory_mb", "256"))), false)
    error_message = "provider_options.node_memory_mb: a whole number of MiB from 256 to 65536 (unset: no memory limit)."
  }
}
