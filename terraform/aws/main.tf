# AWS provider: EC2 instances per role in a given or created VPC, one security group (SSH only from
# allowed_ssh_cidrs, the TensorFlow port only between members), an instance role limited to the cluster's
# runs and its data (storage_access), and instances that terminate themselves after max_runtime_minutes.
#
# The provider block lives here so that tfcluster's generated root only has to call the module; the
# root must therefore not use count/for_each/depends_on on this module. Credentials come from the AWS
# standard chain (environment, shared config/credentials files, instance role): never from a variable.

provider "aws" {
  region = local.region

  # Only for an API emulator (provider_options.endpoint): no STS/IMDS calls, path-style S3.
  skip_credentials_validation = local.emulated ? true : null
  skip_requesting_account_id  = local.emulated ? true : null
  skip_metadata_api_check     = local.emulated ? true : null
  s3_use_path_style           = local.emulated ? true : null

  dynamic "endpoints" {
    for_each = local.emulated ? [local.endpoint] : []
    content {
      ec2 = endpoints.value
      iam = endpoints.value
      sts = endpoints.value
      s3  = endpoints.value
    }
  }

  default_tags {
    tags = local.tags
  }
}

locals {
  opts     = var.provider_options
  region   = lookup(local.opts, "region", "us-east-1")
  endpoint = trimsuffix(lookup(local.opts, "endpoint", ""), "/")
  emulated = local.endpoint != ""

  spot = lookup(local.opts, "spot", "false") == "true"
  # "" = the subnet decides (a created subnet gives public addresses; a given one keeps its setting)
  public_ip_opt  = lookup(local.opts, "associate_public_ip", "")
  root_volume_gb = tonumber(lookup(local.opts, "root_volume_gb", "50"))
  given_subnet   = lookup(local.opts, "subnet_id", "")
  given_vpc      = lookup(local.opts, "vpc_id", "")
  create_network = local.given_subnet == ""
  vpc_cidr       = lookup(local.opts, "vpc_cidr", "10.42.0.0/16")
  given_az       = lookup(local.opts, "availability_zone", "")

  # The VM's own halt, armed at first boot, is a backstop: the run's deadline counts from the start of
  # training, so the tf_node role re-arms the halt then (deadline plus a margin). The allowance covers
  # configuration (packages, a GPU driver, TensorFlow) before training starts.
  configure_allowance_minutes = 60
  halt_after_minutes          = var.max_runtime_minutes + local.configure_allowance_minutes

  tags     = { "tfcluster:cluster" = var.cluster_name }
  ssh_user = var.ssh_user == "" ? "admin" : var.ssh_user # the Debian AMIs' user
  # IAM names are global to the account: the region keeps two clusters of one name apart.
  iam_name = "tfcluster-${var.cluster_name}-${local.region}"
  s3_arn   = "arn:${data.aws_partition.current.partition}:s3:::"

  roles        = ["ps", "worker", "chief"]
  counts       = { ps = var.ps_count, worker = var.worker_count, chief = var.chief_count }
  active_roles = [for r in local.roles : r if local.counts[r] > 0]
  gpus         = { for r in local.roles : r => lookup(var.gpus, r, 0) }

  default_type = { ps = "m6i.large", worker = "c6i.xlarge", chief = "m6i.large" }
  instance_type = { for r in local.roles : r => (
    lookup(var.instance_types, r, "") != "" ? var.instance_types[r] :
    local.gpus[r] == 0 ? local.default_type[r] :
    local.gpus[r] == 1 ? "g4dn.xlarge" :
    local.gpus[r] <= 4 ? "g4dn.12xlarge" : "g4dn.metal"
  ) }
  used_types = toset([for r in local.active_roles : local.instance_type[r]])

  # What the EC2 API says about each type in use: GPU count and CPU architecture.
  type_gpus    = { for t, d in data.aws_ec2_instance_type.used : t => sum(concat([0], [for g in d.gpus : g.count])) }
  type_arch    = { for t, d in data.aws_ec2_instance_type.used : t => contains(d.supported_architectures, "x86_64") ? "amd64" : "arm64" }
  role_arch    = { for r in local.active_roles : r => local.type_arch[local.instance_type[r]] }
  lookup_archs = toset([for r in local.active_roles : local.role_arch[r] if lookup(var.images, r, "") == ""])
  image = { for r in local.active_roles : r => (
    lookup(var.images, r, "") != "" ? var.images[r] : data.aws_ami.debian[local.role_arch[r]].id
  ) }

  ordered = concat(
    [for i in range(var.ps_count) : { role = "ps", index = i }],
    [for i in range(var.worker_count) : { role = "worker", index = i }],
    [for i in range(var.chief_count) : { role = "chief", index = i }],
  )
  nodes = [for n in local.ordered : merge(n, { name = "${var.cluster_name}-${n.role}-${n.index}" })]

  # Zones that offer every instance type in use (for a created subnet without availability_zone).
  pick_az         = local.create_network && local.given_az == "" && length(local.used_types) > 0
  offer_locations = local.pick_az ? data.aws_ec2_instance_type_offerings.used[0].locations : []
  offer_types     = local.pick_az ? data.aws_ec2_instance_type_offerings.used[0].instance_types : []
  offered_azs = sort([for az in distinct(local.offer_locations) : az if alltrue([
    for t in local.used_types : contains([for i, l in local.offer_locations : l if local.offer_types[i] == t], az)
  ])])
  subnet_az = local.given_az != "" ? local.given_az : try(local.offered_azs[0], null)

  vpc_id    = local.create_network ? aws_vpc.cluster[0].id : data.aws_subnet.given[0].vpc_id
  subnet_id = local.create_network ? aws_subnet.cluster[0].id : local.given_subnet
}

data "aws_partition" "current" {}

data "aws_ec2_instance_type" "used" {
  for_each      = local.used_types
  instance_type = each.value
}

data "aws_ec2_instance_type_offerings" "used" {
  count         = local.pick_az ? 1 : 0
  location_type = "availability-zone"
  filter {
    name   = "instance-type"
    values = sort(local.used_types)
  }
}

# Debian 12 (bookworm, Python 3.11) from the Debian cloud team's account, newest first, per CPU
# architecture in use (image names debian-12-amd64-YYYYMMDD-NNNN, debian-12-arm64-...; the pattern
# leaves out the debian-12-backports-* images). Its default user is admin.
data "aws_ami" "debian" {
  for_each    = local.lookup_archs
  most_recent = true
  owners      = ["136693071363"]
  filter {
    name   = "name"
    values = ["debian-12-${each.value}-*"]
  }
  filter {
    name   = "virtualization-type"
    values = ["hvm"]
  }
}

# -- network: the given subnet, or a small VPC with one public subnet -------------------------------

data "aws_subnet" "given" {
  count = local.create_network ? 0 : 1
  id    = local.given_subnet
  lifecycle {
    postcondition {
      condition     = local.given_vpc == "" || self.vpc_id == local.given_vpc
      error_message = "provider_options.subnet_id ${local.given_subnet} is in ${self.vpc_id}, not in provider_options.vpc_id ${local.given_vpc}."
    }
  }
}

resource "aws_vpc" "cluster" {
  # checkov:skip=CKV2_AWS_11:flow logs need a log group and a role of their own and would be destroyed with the VPC by down; the VPC exists only while one training run does and its only group admits SSH from allowed_ssh_cidrs and gRPC between members
  count                = local.create_network ? 1 : 0
  cidr_block           = local.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = "tfcluster-${var.cluster_name}" }
}

# The created VPC's default security group, emptied: nothing that lands in it by default is reachable or
# reaches out (the nodes carry the cluster's own group only).
resource "aws_default_security_group" "cluster" {
  count  = local.create_network ? 1 : 0
  vpc_id = aws_vpc.cluster[0].id
  tags   = { Name = "tfcluster-${var.cluster_name}-default" }
}

resource "aws_subnet" "cluster" {
  count             = local.create_network ? 1 : 0
  vpc_id            = aws_vpc.cluster[0].id
  cidr_block        = cidrsubnet(local.vpc_cidr, 24 - tonumber(split("/", local.vpc_cidr)[1]), 0)
  availability_zone = local.subnet_az
  # Nodes need a public address for SSH from the controller unless associate_public_ip = "false".
  map_public_ip_on_launch = local.public_ip_opt != "false"
  tags                    = { Name = "tfcluster-${var.cluster_name}" }
  lifecycle {
    precondition {
      condition     = local.subnet_az != null || !local.pick_az
      error_message = "No availability zone of ${local.region} offers all of the instance types ${join(", ", sort(local.used_types))}; choose other types or set provider_options.availability_zone."
    }
  }
}

resource "aws_internet_gateway" "cluster" {
  count  = local.create_network ? 1 : 0
  vpc_id = aws_vpc.cluster[0].id
  tags   = { Name = "tfcluster-${var.cluster_name}" }
}

resource "aws_route_table" "cluster" {
  count  = local.create_network ? 1 : 0
  vpc_id = aws_vpc.cluster[0].id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.cluster[0].id
  }
  tags = { Name = "tfcluster-${var.cluster_name}" }
}

resource "aws_route_table_association" "cluster" {
  count          = local.create_network ? 1 : 0
  subnet_id      = aws_subnet.cluster[0].id
  route_table_id = aws_route_table.cluster[0].id
}

# -- security group: SSH from allowed_ssh_cidrs only; the TF port only between members -------------

resource "aws_security_group" "cluster" {
  name        = "tfcluster-${var.cluster_name}"
  description = "tfcluster ${var.cluster_name}: SSH from allowed_ssh_cidrs, TF gRPC between members only"
  vpc_id      = local.vpc_id
  tags        = { Name = "tfcluster-${var.cluster_name}" }
}

resource "aws_vpc_security_group_ingress_rule" "ssh" {
  for_each          = toset(var.allowed_ssh_cidrs)
  security_group_id = aws_security_group.cluster.id
  description       = "SSH from an allowed network"
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
  cidr_ipv4         = strcontains(each.value, ":") ? null : each.value
  cidr_ipv6         = strcontains(each.value, ":") ? each.value : null
  tags              = { Name = "tfcluster-${var.cluster_name}-ssh" }
}

resource "aws_vpc_security_group_ingress_rule" "tf_port" {
  security_group_id            = aws_security_group.cluster.id
  description                  = "TensorFlow gRPC between cluster members only"
  ip_protocol                  = "tcp"
  from_port                    = var.tf_port
  to_port                      = var.tf_port
  referenced_security_group_id = aws_security_group.cluster.id
  tags                         = { Name = "tfcluster-${var.cluster_name}-tf-grpc" }
}

resource "aws_vpc_security_group_egress_rule" "all" {
  security_group_id = aws_security_group.cluster.id
  description       = "Outbound: packages, S3, the AWS APIs"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
  tags              = { Name = "tfcluster-${var.cluster_name}-egress" }
}

# -- identity: the run's key pair and an instance role limited to the cluster's runs and data --------

resource "aws_key_pair" "cluster" {
  key_name   = "tfcluster-${var.cluster_name}"
  public_key = trimspace(var.ssh_public_key)
  tags       = { Name = "tfcluster-${var.cluster_name}" }
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.${data.aws_partition.current.dns_suffix}"]
    }
  }
}

# tfcluster/access.py states what the nodes use: their cluster's runs (the chief writes checkpoints, rotates
# them out and publishes the model; workers may read checkpoints) and their data, which they only read and
# never list (the controller lists it and hands each task its keys).
data "aws_iam_policy_document" "s3" {
  statement {
    sid       = "ClusterRuns"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = ["${local.s3_arn}${var.bucket}/${var.storage_access.read_write}*"]
  }
  statement {
    sid       = "ListClusterRuns"
    actions   = ["s3:ListBucket"]
    resources = ["${local.s3_arn}${var.bucket}"]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.storage_access.read_write}*"]
    }
  }
  dynamic "statement" {
    for_each = length(var.storage_access.read) > 0 ? [1] : []
    content {
      sid       = "ReadTrainingData"
      actions   = ["s3:GetObject"]
      resources = [for g in var.storage_access.read : "${local.s3_arn}${g.bucket}/${g.prefix}*"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = local.iam_name
  description        = "tfcluster ${var.cluster_name} nodes: s3://${var.bucket}/${var.storage_access.read_write} and their data (read only)"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = { Name = local.iam_name }
}

resource "aws_iam_role_policy" "s3" {
  name   = "tfcluster-run-data"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.s3.json
  lifecycle {
    precondition {
      condition     = startswith(var.storage_access.read_write, "${var.prefix}/")
      error_message = "storage_access.read_write ${var.storage_access.read_write} is not under prefix ${var.prefix}/: the nodes may write only inside the runs' prefix."
    }
  }
}

resource "aws_iam_instance_profile" "node" {
  name = local.iam_name
  role = aws_iam_role.node.name
  tags = { Name = local.iam_name }
}

# -- nodes ----------------------------------------------------------------------------------------

resource "aws_instance" "node" {
  # checkov:skip=CKV_AWS_126:detailed (1-minute) monitoring is billed per instance; a one-off training run reports its own progress (make status) and ends itself at its deadline
  # checkov:skip=CKV_AWS_135:the default types (m6i, c6i, g4dn) are EBS-optimized whatever this says; forcing it would refuse older types a user may name in instance_types
  for_each = { for n in local.nodes : n.name => n }

  ami                         = local.image[each.value.role]
  instance_type               = local.instance_type[each.value.role]
  subnet_id                   = local.subnet_id
  vpc_security_group_ids      = [aws_security_group.cluster.id]
  associate_public_ip_address = local.public_ip_opt == "" ? null : local.public_ip_opt == "true"
  key_name                    = aws_key_pair.cluster.key_name
  iam_instance_profile        = contains(var.storage_access.jobs, each.value.role) ? aws_iam_instance_profile.node.name : null

  # A forgotten cluster ends itself: halting the guest terminates the instance, and the user data
  # halts it max_runtime_minutes plus the configure allowance after the first boot (again after a
  # reboot, for the time left); tf_node re-arms it from the run's deadline when training starts.
  instance_initiated_shutdown_behavior = "terminate"
  user_data = templatefile("${path.module}/templates/user_data.sh.tftpl", {
    name    = each.key
    minutes = local.halt_after_minutes
  })
  user_data_replace_on_change = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_size           = local.root_volume_gb
    volume_type           = "gp3"
    encrypted             = true
    delete_on_termination = true
    tags                  = merge(local.tags, { Name = "${each.key}-root" })
  }

  dynamic "instance_market_options" {
    for_each = local.spot ? [1] : []
    content {
      market_type = "spot"
      spot_options {
        spot_instance_type             = "one-time"
        instance_interruption_behavior = "terminate"
      }
    }
  }

  tags = {
    Name              = each.key
    "tfcluster:role"  = each.value.role
    "tfcluster:index" = tostring(each.value.index)
  }

  lifecycle {
    precondition {
      condition     = local.gpus[each.value.role] <= local.type_gpus[local.instance_type[each.value.role]]
      error_message = "gpus.${each.value.role} = ${local.gpus[each.value.role]} needs an instance type with at least that many GPUs; ${local.instance_type[each.value.role]} has ${local.type_gpus[local.instance_type[each.value.role]]}. Use a GPU type (e.g. g4dn.xlarge for 1, g4dn.12xlarge for 4) or leave instance_types.${each.value.role} empty for the default."
    }
  }
}
