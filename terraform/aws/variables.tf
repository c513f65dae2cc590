# The shared interface: every provider module under terraform/ declares exactly these inputs
# (tests/unit/test_terraform_interface.py checks it). AWS-specific settings travel in provider_options.
# Rules that involve more than one variable, or facts only the AWS API knows (GPUs of an instance type),
# are preconditions in main.tf.

variable "cluster_name" {
  description = "Cluster name; node names (<cluster>-<role>-<index>) and AWS resource names derive from it."
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
  description = "EC2 instance type per role (keys ps, worker, chief); '' or a missing key = the role's default (ps/chief m6i.large, worker c6i.xlarge; with GPUs g4dn.xlarge, g4dn.12xlarge for 2-4, g4dn.metal for 5-8)."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.instance_types) : contains(["ps", "worker", "chief"], k)])
    error_message = "instance_types: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for t in values(var.instance_types) : t == "" || can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", t))])
    error_message = "instance_types: '' (the role's default) or an EC2 instance type such as c6i.xlarge or g4dn.xlarge."
  }
}

variable "images" {
  description = "AMI id per role (keys ps, worker, chief); '' or a missing key = the newest official Debian 12 AMI (owner 136693071363, debian-12-<amd64|arm64>-*, Python 3.11, user admin) for the instance type's architecture."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.images) : contains(["ps", "worker", "chief"], k)])
    error_message = "images: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for i in values(var.images) : i == "" || can(regex("^ami-[0-9a-f]{8}([0-9a-f]{9})?$", i))])
    error_message = "images: '' (Debian 12) or an AMI id such as ami-0123456789abcdef0."
  }
}

variable "gpus" {
  description = "GPUs per node, per role (keys ps, worker, chief). A value above 0 needs an instance type with at least that many GPUs (checked against the EC2 API)."
  type        = map(number)
  default     = {}
  validation {
    condition     = alltrue([for k in keys(var.gpus) : contains(["ps", "worker", "chief"], k)])
    error_message = "gpus: keys are roles: ps, worker, chief."
  }
  validation {
    condition     = alltrue([for g in values(var.gpus) : g >= 0 && g <= 16 && g == floor(g)])
    error_message = "gpus: whole numbers from 0 to 16."
  }
}

variable "ssh_public_key" {
  description = "The run's SSH public key (OpenSSH format), imported as the cluster's EC2 key pair."
  type        = string
  validation {
    condition     = can(regex("^ssh-(ed25519|rsa) [A-Za-z0-9+/]+={0,3}( [^\\n]*)?$", trimspace(var.ssh_public_key)))
    error_message = "ssh_public_key: one OpenSSH public key line starting with ssh-ed25519 or ssh-rsa."
  }
}

variable "ssh_user" {
  description = "SSH user on the nodes; '' = admin (the Debian AMIs' user). Set it when an image in images uses another user."
  type        = string
  default     = ""
  validation {
    condition     = var.ssh_user == "" || can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))
    error_message = "ssh_user: '' (admin) or a Unix user name (lowercase letters, digits, '_' and '-', up to 32 characters)."
  }
}

variable "allowed_ssh_cidrs" {
  description = "Networks allowed to reach SSH (port 22), IPv4 or IPv6 CIDR blocks. Required: there is no open default; 0.0.0.0/0 or ::/0 only if listed here."
  type        = list(string)
  default     = []
  validation {
    condition     = length(var.allowed_ssh_cidrs) > 0
    error_message = "allowed_ssh_cidrs: at least one network must be listed, e.g. [\"203.0.113.0/24\"] (your address or VPN range); there is no open default - SSH is open to the internet only if 0.0.0.0/0 (or ::/0) is listed explicitly."
  }
  validation {
    condition     = alltrue([for c in var.allowed_ssh_cidrs : try(cidrsubnet(c, 0, 0) == c, false)])
    error_message = "allowed_ssh_cidrs: CIDR blocks in canonical form (network address, no host bits), e.g. 203.0.113.0/24, 198.51.100.7/32 or 2001:db8::/32."
  }
}

variable "tf_port" {
  description = "TensorFlow gRPC port; reachable only from members of the cluster's security group, never from outside it."
  type        = number
  default     = 2222
  validation {
    condition     = var.tf_port >= 1024 && var.tf_port <= 65535 && var.tf_port == floor(var.tf_port)
    error_message = "tf_port: a whole number from 1024 to 65535."
  }
}

variable "bucket" {
  description = "S3 bucket of the run; the nodes' instance role may use only storage_access.read_write in it (and what storage_access.read names)."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket: an S3 bucket name: 3-63 characters, lowercase letters, digits, '.' and '-', starting and ending with a letter or digit, no '..'."
  }
}

variable "prefix" {
  description = "Key prefix of the runs inside the bucket (no leading or trailing '/')."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$", var.prefix)) && !strcontains(var.prefix, "..") && !strcontains(var.prefix, "//") && !endswith(var.prefix, "/") && !contains(["datasets"], var.prefix)
    error_message = "prefix: letters, digits, '.', '_', '-', '/' (no leading or trailing '/', no '..' or '//'), and not 'datasets' (kept for the shared datasets)."
  }
}

variable "storage_access" {
  description = <<-EOT
    What the nodes' instance role may do in S3, computed by tfcluster (tfcluster/access.py):
    jobs, the roles whose instances get the role at all (tfcluster: worker and chief; ps nodes only hold variables);
    read_write, the key prefix in bucket of this cluster's runs (<prefix>/<cluster>/): get, put, delete and abort uploads, and list under it;
    read, the data the cluster trains on, as bucket and key prefix ('' = the whole bucket): get only.
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
    error_message = "storage_access.read: bucket names, and key prefixes of letters, digits and ! _ . ' ( ) / - only (a policy names them as they are: no wildcard, no '$')."
  }
}

variable "max_runtime_minutes" {
  description = "Hard limit of a run, counted from the start of training. Each instance halts itself (and so terminates) this many minutes plus a 60-minute configuration allowance after boot, a backstop that tfcluster's tf_node role replaces with the run's deadline plus a margin when training starts."
  type        = number
  validation {
    condition     = var.max_runtime_minutes >= 1 && var.max_runtime_minutes <= 10080 && var.max_runtime_minutes == floor(var.max_runtime_minutes)
    error_message = "max_runtime_minutes: a whole number from 1 to 10080 (one week)."
  }
}

variable "provider_options" {
  description = <<-EOT
    AWS settings (all strings, all optional):
    region (default us-east-1); vpc_id and subnet_id (use this network; subnet_id alone is enough, vpc_id alone is refused);
    vpc_cidr (the created VPC's network when no subnet_id is given, /16 to /24, default 10.42.0.0/16);
    availability_zone (of the created subnet; default: the first zone offering every instance type);
    associate_public_ip ("true"/"false"; default: a created subnet gives public addresses, a given subnet keeps its own setting; "false" needs subnet_id and subnet_has_nat "true"); subnet_has_nat ("true": the given subnet has a NAT route); spot ("true"/"false", default "false");
    root_volume_gb (8-16384, default 50); endpoint (an AWS API emulator URL for tests, e.g. http://127.0.0.1:5000).
  EOT
  type        = map(string)
  default     = {}
  validation {
    condition = alltrue([for k in keys(var.provider_options) : contains([
      "region", "vpc_id", "subnet_id", "vpc_cidr", "availability_zone", "associate_public_ip", "subnet_has_nat", "spot", "root_volume_gb", "endpoint"
    ], k)])
    error_message = "provider_options: known keys are region, vpc_id, subnet_id, vpc_cidr, availability_zone, associate_public_ip, subnet_has_nat, spot, root_volume_gb, endpoint."
  }
  validation {
    condition     = lookup(var.provider_options, "associate_public_ip", "") != "false" || (lookup(var.provider_options, "subnet_id", "") != "" && lookup(var.provider_options, "subnet_has_nat", "false") == "true")
    error_message = "provider_options.associate_public_ip: \"false\" only with a subnet_id whose route to the internet is a NAT (subnet_has_nat \"true\"): without a public address an instance reaches apt and PyPI only through NAT, and the created network has none."
  }
  validation {
    condition     = contains(["true", "false"], lookup(var.provider_options, "subnet_has_nat", "false"))
    error_message = "provider_options.subnet_has_nat: \"true\" or \"false\"."
  }
  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", lookup(var.provider_options, "region", "us-east-1")))
    error_message = "provider_options.region: an AWS region name such as us-east-1 or eu-west-3."
  }
  validation {
    condition     = contains(["true", "false"], lookup(var.provider_options, "spot", "false")) && contains(["", "true", "false"], lookup(var.provider_options, "associate_public_ip", ""))
    error_message = "provider_options.spot and provider_options.associate_public_ip: \"true\" or \"false\"."
  }
  validation {
    condition     = try(tonumber(lookup(var.provider_options, "root_volume_gb", "50")) >= 8 && tonumber(lookup(var.provider_options, "root_volume_gb", "50")) <= 16384 && can(regex("^[0-9]+$", lookup(var.provider_options, "root_volume_gb", "50"))), false)
    error_message = "provider_options.root_volume_gb: a whole number of GiB from 8 to 16384."
  }
  validation {
    condition     = can(regex("^(vpc-[0-9a-f]{8}([0-9a-f]{9})?)?$", lookup(var.provider_options, "vpc_id", ""))) && can(regex("^(subnet-[0-9a-f]{8}([0-9a-f]{9})?)?$", lookup(var.provider_options, "subnet_id", "")))
    error_message = "provider_options.vpc_id / subnet_id: ids such as vpc-0123456789abcdef0 / subnet-0123456789abcdef0."
  }
  validation {
    condition     = lookup(var.provider_options, "vpc_id", "") == "" || lookup(var.provider_options, "subnet_id", "") != ""
    error_message = "provider_options.vpc_id: give subnet_id too (the subnet the nodes go into), or neither to create a small VPC."
  }
  validation {
    condition     = try(cidrsubnet(lookup(var.provider_options, "vpc_cidr", "10.42.0.0/16"), 0, 0) == lookup(var.provider_options, "vpc_cidr", "10.42.0.0/16") && !strcontains(lookup(var.provider_options, "vpc_cidr", "10.42.0.0/16"), ":") && tonumber(split("/", lookup(var.provider_options, "vpc_cidr", "10.42.0.0/16"))[1]) >= 16 && tonumber(split("/", lookup(var.provider_options, "vpc_cidr", "10.42.0.0/16"))[1]) <= 24, false)
    error_message = "provider_options.vpc_cidr: an IPv4 network from /16 to /24 in canonical form, e.g. 10.42.0.0/16."
  }
  validation {
    condition     = lookup(var.provider_options, "subnet_id", "") == "" || (lookup(var.provider_options, "vpc_cidr", "") == "" && lookup(var.provider_options, "availability_zone", "") == "")
    error_message = "provider_options.vpc_cidr and availability_zone apply only to a created network; with subnet_id the subnet decides both."
  }
  validation {
    condition     = can(regex("^([a-z]{2}(-[a-z]+)+-[0-9][a-z])?$", lookup(var.provider_options, "availability_zone", "")))
    error_message = "provider_options.availability_zone: a zone name such as us-east-1a."
  }
  validation {
    condition     = can(regex("^(https?://[A-Za-z0-9.:\\[\\]-]+(:[0-9]{1,5})?/?)?$", lookup(var.provider_options, "endpoint", "")))
    error_message = "provider_options.endpoint: an http(s)://host[:port] URL of an AWS API emulator (tests only), or absent."
  }
}
