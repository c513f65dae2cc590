# The shared interface: every provider module under terraform/ declares exactly these inputs
# (tests/unit/test_terraform_interface.py checks it). OpenStack-specific settings travel in
# provider_options. No variable carries a credential: the provider reads clouds.yaml (and
# secure.yaml) or OS_* variables of whoever runs tfcluster.

variable "cluster_name" {
  description = "Cluster name; instance, port, network, security group and keypair names derive from it."
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
  description = "Nova flavor name per role (ps, worker, chief); '' or absent means provider_options.flavor (default m1.large). A role with GPUs needs a GPU flavor of the site here."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.instance_types) : contains(["ps", "worker", "chief"], k)])
    error_message = "instance_types: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for v in values(var.instance_types) : can(regex("^[^\\s]{0,255}$", v))])
    error_message = "instance_types: '' (provider_options.flavor) or a flavor name without spaces, at most 255 characters."
  }
}

variable "images" {
  description = "Glance image per role: an image UUID or an exact image name (the most recent of that name); '' or absent means the most recent image whose name matches provider_options.image_regex (Debian 12 by default: the Debian cloud team's generic OpenStack image, debian-12-generic-amd64.qcow2, uploaded to Glance under a name such as 'debian-12' or 'Debian 12 bookworm')."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.images) : contains(["ps", "worker", "chief"], k)])
    error_message = "images: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for v in values(var.images) : can(regex("^[^\\n\\r]{0,255}$", v))])
    error_message = "images: '' (Debian 12 lookup) or an image UUID or name on one line, at most 255 characters."
  }
}

variable "gpus" {
  description = "GPUs per node, per role. OpenStack attaches GPUs through the flavor (PCI passthrough or vGPU): a role with gpus > 0 needs its GPU flavor in instance_types; this number is what the nodes are configured for."
  type        = map(number)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.gpus) : contains(["ps", "worker", "chief"], k)])
    error_message = "gpus: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for g in values(var.gpus) : g >= 0 && g <= 16 && g == floor(g)])
    error_message = "gpus: a whole number from 0 to 16 per node."
  }
}

variable "ssh_public_key" {
  description = "The run's SSH public key (OpenSSH format): the module's keypair (the image's default user) and, for another ssh_user, that user's only authorised key."
  type        = string
  validation {
    condition     = can(regex("^ssh-(ed25519|rsa) [A-Za-z0-9+/=]+( [^\n]*)?\n?$", var.ssh_public_key))
    error_message = "ssh_public_key: one OpenSSH public key line starting with ssh-ed25519 or ssh-rsa."
  }
}

variable "ssh_user" {
  description = "SSH user on the nodes; '' means debian (the default user of Debian cloud images). Another name is created by cloud-init with the run's key and passwordless sudo."
  type        = string
  default     = ""
  validation {
    condition     = var.ssh_user == "" || (can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user)) && var.ssh_user != "root")
    error_message = "ssh_user: '' (debian) or a Unix user name ([a-z_][a-z0-9_-]{0,31}) other than root."
  }
}

variable "allowed_ssh_cidrs" {
  description = "IPv4 or IPv6 networks allowed to reach SSH (tcp/22) on the nodes. Required: there is no open default."
  type        = list(string)
  default     = []
  validation {
    condition     = length(var.allowed_ssh_cidrs) > 0
    error_message = "allowed_ssh_cidrs: at least one CIDR block such as 203.0.113.0/24 (clouds have no open default)."
  }
  validation {
    condition     = alltrue([for c in var.allowed_ssh_cidrs : can(cidrhost(c, 0))])
    error_message = "allowed_ssh_cidrs: IPv4 or IPv6 CIDR blocks such as 203.0.113.0/24 or 2001:db8::/48."
  }
}

variable "tf_port" {
  description = "TensorFlow gRPC port, reachable only from ports in the cluster's own security group."
  type        = number
  default     = 2222
  validation {
    condition     = var.tf_port >= 1024 && var.tf_port <= 65535 && var.tf_port == floor(var.tf_port)
    error_message = "tf_port: a whole number from 1024 to 65535."
  }
}

variable "bucket" {
  description = "Bucket of the run in the site's S3-compatible object store. The module grants nothing: the store's credentials reach the nodes only through tfcluster's 0600 environment file."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket: an S3 bucket name of 3-63 characters: lowercase letters, digits, '.' and '-', starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix of the run inside the bucket (recorded in instance metadata)."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$", var.prefix)) && !strcontains(var.prefix, "..")
    error_message = "prefix: letters, digits, '.', '_', '-', '/' (no leading '/', no '..'), at most 200 characters."
  }
}

variable "storage_access" {
  description = "What the nodes may do in object storage (tfcluster/access.py): jobs, read_write, read. Ignored here: the module creates no credentials; tfcluster puts the site's S3 keys on the nodes of storage_access.jobs only, while their tasks run."
  type = object({
    jobs       = list(string)
    read_write = string
    read = list(object({
      bucket = string
      prefix = string
    }))
  })
}

variable "max_runtime_minutes" {
  description = "Hard limit of a run, counted from the start of training. Backstop: cloud-init schedules `shutdown -h +<minutes + 60>` at first boot (60 minutes for configuration); tfcluster's tf_node role re-arms it for the run's deadline plus a margin. OpenStack has no server-side run limit; a powered-off server keeps its allocation until `make down`."
  type        = number
  validation {
    condition     = var.max_runtime_minutes >= 1 && var.max_runtime_minutes <= 10080 && var.max_runtime_minutes == floor(var.max_runtime_minutes)
    error_message = "max_runtime_minutes: a whole number from 1 to 10080 (7 days)."
  }
}

variable "provider_options" {
  description = "OpenStack settings (all strings): cloud (clouds.yaml entry; '' = OS_CLOUD / OS_* variables), region, external_network (for the router and floating IPs), network (existing network name; '' = create one routed to external_network), subnet_cidr (10.20.0.0/24), dns_nameservers (comma-separated), floating_ip (true), flavor (m1.large), image_regex (^(?i)debian[ -]?12([^0-9]|$)), availability_zone, volume_size_gb (0 = the flavor's root disk)."
  type        = map(string)
  default     = {}
  validation {
    condition = alltrue([for k in keys(var.provider_options) : contains([
      "cloud", "region", "external_network", "network", "subnet_cidr", "dns_nameservers", "floating_ip",
      "flavor", "image_regex", "availability_zone", "volume_size_gb",
    ], k)])
    error_message = "provider_options: known keys are cloud, region, external_network, network, subnet_cidr, dns_nameservers, floating_ip, flavor, image_regex, availability_zone, volume_size_gb."
  }
  validation {
    condition     = contains(["true", "false"], lookup(var.provider_options, "floating_ip", "true"))
    error_message = "provider_options.floating_ip: true or false."
  }
  validation {
    condition = (lookup(var.provider_options, "external_network", "") != "" || (
    lookup(var.provider_options, "network", "") != "" && lookup(var.provider_options, "floating_ip", "true") == "false"))
    error_message = "provider_options.external_network: required (the name of the site's external network) unless provider_options.network names an existing network and floating_ip is false."
  }
  validation {
    condition     = can(cidrnetmask(lookup(var.provider_options, "subnet_cidr", "10.20.0.0/24")))
    error_message = "provider_options.subnet_cidr: an IPv4 CIDR block such as 10.20.0.0/24."
  }
  validation {
    condition = alltrue([for s in split(",", lookup(var.provider_options, "dns_nameservers", "")) :
    trimspace(s) == "" || can(cidrhost("${trimspace(s)}/32", 0)) || can(cidrhost("${trimspace(s)}/128", 0))])
    error_message = "provider_options.dns_nameservers: comma-separated IP addresses such as 192.0.2.53,192.0.2.54."
  }
  validation {
    condition     = try(tonumber(lookup(var.provider_options, "volume_size_gb", "0")) >= 0 && tonumber(lookup(var.provider_options, "volume_size_gb", "0")) <= 65536 && tonumber(lookup(var.provider_options, "volume_size_gb", "0")) == floor(tonumber(lookup(var.provider_options, "volume_size_gb", "0"))), false)
    error_message = "provider_options.volume_size_gb: 0 (boot from the flavor's root disk) or a whole number of GB up to 65536 (boot from a new volume of that size)."
  }
  validation {
    condition     = can(regexall(lookup(var.provider_options, "image_regex", "^(?i)debian[ -]?12([^0-9]|$)"), ""))
    error_message = "provider_options.image_regex: a regular expression (RE2 syntax) matched against image names."
  }
  validation {
    condition = alltrue([for k in ["cloud", "region", "external_network", "network", "flavor", "availability_zone"] :
    can(regex("^[^\\n\\r]{0,255}$", lookup(var.provider_options, k, "")))])
    error_message = "provider_options: cloud, region, external_network, network, flavor and availability_zone are single-line names of at most 255 characters."
  }
}
