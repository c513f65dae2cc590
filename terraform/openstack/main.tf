# OpenStack provider: one Nova server per node on its own Neutron port, a network routed to the
# site's external network (or an existing one), floating IPs for SSH from the controller, and a
# security group that admits SSH only from allowed_ssh_cidrs and the TensorFlow gRPC port only from
# ports of the same group. The ports carry this group alone, so the project's "default" group (which
# admits everything from its members) does not apply to the nodes.
#
# tfcluster's per-cluster root calls this module without provider configuration, so the module
# configures the openstack provider itself: credentials come from clouds.yaml/secure.yaml (the
# `cloud` option, else OS_CLOUD) or OS_* variables, never from Terraform variables or state.
# Object-store credentials are not created here: S3-compatible keys of the site's store reach the
# nodes only through tfcluster's 0600 environment file.

provider "openstack" {
  cloud  = local.cloud
  region = local.region
}

locals {
  roles = ["ps", "worker", "chief"]
  opts  = var.provider_options

  cloud             = lookup(local.opts, "cloud", "") == "" ? null : lookup(local.opts, "cloud", "")
  region            = lookup(local.opts, "region", "") == "" ? null : lookup(local.opts, "region", "")
  external_network  = lookup(local.opts, "external_network", "")
  floating_ip       = lookup(local.opts, "floating_ip", "true") == "true"
  subnet_cidr       = lookup(local.opts, "subnet_cidr", "10.20.0.0/24")
  dns_nameservers   = [for s in split(",", lookup(local.opts, "dns_nameservers", "")) : trimspace(s) if trimspace(s) != ""]
  default_flavor    = lookup(local.opts, "flavor", "") == "" ? "m1.large" : lookup(local.opts, "flavor", "")
  image_regex       = lookup(local.opts, "image_regex", "^(?i)debian[ -]?12([^0-9]|$)")
  availability_zone = lookup(local.opts, "availability_zone", "") == "" ? null : lookup(local.opts, "availability_zone", "")
  volume_size       = tonumber(lookup(local.opts, "volume_size_gb", "0"))

  name     = "tfcluster-${var.cluster_name}"
  ssh_user = var.ssh_user == "" ? "debian" : var.ssh_user # the default user of Debian cloud images

  create_network = lookup(local.opts, "network", "") == ""
  network_id = (local.create_network ? one(openstack_networking_network_v2.cluster[*].id) :
  one(data.openstack_networking_network_v2.existing[*].id))

  counts = { ps = var.ps_count, worker = var.worker_count, chief = var.chief_count }
  gpus   = { for r in local.roles : r => lookup(var.gpus, r, 0) }
  flavor = { for r in local.roles : r => lookup(var.instance_types, r, "") != "" ? var.instance_types[r] : local.default_flavor }

  # Images: a UUID is used as is, a name is looked up (most recent of that name), '' falls back to
  # the most recent image matching image_regex. Only roles with nodes are looked up.
  uuid_re             = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
  image_value         = { for r in local.roles : r => trimspace(lookup(var.images, r, "")) }
  active_roles        = [for r in local.roles : r if local.counts[r] > 0]
  image_names         = toset([for r in local.active_roles : local.image_value[r] if local.image_value[r] != "" && !can(regex(local.uuid_re, local.image_value[r]))])
  needs_default_image = anytrue([for r in local.active_roles : local.image_value[r] == ""])
  named_image_id      = { for name, image in data.openstack_images_image_v2.named : name => image.id }
  image_id = { for r in local.active_roles : r => (
    local.image_value[r] == "" ? one(data.openstack_images_image_v2.default[*].id) :
    lookup(local.named_image_id, local.image_value[r], local.image_value[r]) # a UUID stands for itself
  ) }

  # cloud-init user data: readable by any process on the node through the metadata service, so it
  # holds nothing secret (the public key and the run limit only).
  user_data = templatefile("${path.module}/templates/user-data.yaml.tftpl", {
    cluster        = var.cluster_name
    ssh_user       = local.ssh_user
    create_user    = local.ssh_user != "debian"
    ssh_public_key = trimspace(var.ssh_public_key)
    minutes        = var.max_runtime_minutes + 60 # backstop: tf_node re-arms the halt from the run's deadline
  })

  # The nodes' IPv4 address on the cluster network (the ClusterSpec and SSH use IPv4).
  private_ip = { for name, port in openstack_networking_port_v2.node :
    name => [for ip in port.all_fixed_ips : ip if !strcontains(ip, ":")][0]
  }

  ordered = concat(
    [for i in range(var.ps_count) : { role = "ps", index = i }],
    [for i in range(var.worker_count) : { role = "worker", index = i }],
    [for i in range(var.chief_count) : { role = "chief", index = i }],
  )
  nodes = { for n in local.ordered : "${var.cluster_name}-${n.role}-${n.index}" => n }
}

# --- lookups --------------------------------------------------------------------------------------

data "openstack_images_image_v2" "default" {
  count       = local.needs_default_image ? 1 : 0
  name_regex  = local.image_regex
  most_recent = true
}

data "openstack_images_image_v2" "named" {
  for_each    = local.image_names
  name        = each.key
  most_recent = true
}

data "openstack_networking_network_v2" "external" {
  count    = local.external_network != "" ? 1 : 0
  name     = local.external_network
  external = true
}

data "openstack_networking_network_v2" "existing" {
  count = local.create_network ? 0 : 1
  name  = lookup(local.opts, "network", "")
}

# --- network (unless provider_options.network names an existing one) -----------------------------

resource "openstack_networking_network_v2" "cluster" {
  count                 = local.create_network ? 1 : 0
  name                  = local.name
  description           = "tfcluster ${var.cluster_name}: cluster network"
  admin_state_up        = true
  port_security_enabled = true
}

resource "openstack_networking_subnet_v2" "cluster" {
  count           = local.create_network ? 1 : 0
  name            = local.name
  network_id      = openstack_networking_network_v2.cluster[0].id
  cidr            = local.subnet_cidr
  ip_version      = 4
  dns_nameservers = local.dns_nameservers
}

resource "openstack_networking_router_v2" "cluster" {
  count               = local.create_network ? 1 : 0
  name                = local.name
  description         = "tfcluster ${var.cluster_name}: route to ${local.external_network}"
  admin_state_up      = true
  external_network_id = data.openstack_networking_network_v2.external[0].id
}

resource "openstack_networking_router_interface_v2" "cluster" {
  count     = local.create_network ? 1 : 0
  router_id = openstack_networking_router_v2.cluster[0].id
  subnet_id = openstack_networking_subnet_v2.cluster[0].id
}

# --- security group: the only group on the nodes' ports --------------------------------------------

# Neutron adds its default egress rules (any IPv4, any IPv6) to a new group: nodes reach package
# mirrors and the object store. Ingress is only what the rules below admit.
resource "openstack_networking_secgroup_v2" "cluster" {
  name        = local.name
  description = "tfcluster ${var.cluster_name}: SSH from allowed_ssh_cidrs, TensorFlow gRPC between members"
}

# SSH from the allowed networks only, one rule per network.
resource "openstack_networking_secgroup_rule_v2" "ssh" {
  for_each          = toset(var.allowed_ssh_cidrs)
  description       = "tfcluster ${var.cluster_name}: SSH from ${each.key}"
  direction         = "ingress"
  ethertype         = strcontains(each.key, ":") ? "IPv6" : "IPv4"
  protocol          = "tcp"
  port_range_min    = 22
  port_range_max    = 22
  remote_ip_prefix  = each.key
  security_group_id = openstack_networking_secgroup_v2.cluster.id
}

# The TensorFlow gRPC port (no authentication) only from ports in this same group.
resource "openstack_networking_secgroup_rule_v2" "tf_grpc" {
  description       = "tfcluster ${var.cluster_name}: TensorFlow gRPC between cluster members"
  direction         = "ingress"
  ethertype         = "IPv4"
  protocol          = "tcp"
  port_range_min    = var.tf_port
  port_range_max    = var.tf_port
  remote_group_id   = openstack_networking_secgroup_v2.cluster.id
  security_group_id = openstack_networking_secgroup_v2.cluster.id
}

# --- access ---------------------------------------------------------------------------------------

resource "openstack_compute_keypair_v2" "run" {
  name       = local.name
  public_key = trimspace(var.ssh_public_key)
}

resource "openstack_networking_port_v2" "node" {
  for_each = local.nodes

  name                  = each.key
  description           = "tfcluster ${var.cluster_name}: ${each.value.role} ${each.value.index}"
  network_id            = local.network_id
  admin_state_up        = true
  port_security_enabled = true
  security_group_ids    = [openstack_networking_secgroup_v2.cluster.id]

  dynamic "fixed_ip" {
    for_each = local.create_network ? [1] : []
    content {
      subnet_id = openstack_networking_subnet_v2.cluster[0].id
    }
  }
}

resource "openstack_networking_floatingip_v2" "node" {
  for_each    = local.floating_ip ? local.nodes : {}
  pool        = local.external_network
  description = "tfcluster ${var.cluster_name}: ${each.key}"
}

resource "openstack_networking_floatingip_associate_v2" "node" {
  for_each    = local.floating_ip ? local.nodes : {}
  floating_ip = openstack_networking_floatingip_v2.node[each.key].address
  port_id     = openstack_networking_port_v2.node[each.key].id

  # A floating IP needs the subnet attached to a router with an external gateway.
  depends_on = [openstack_networking_router_interface_v2.cluster]
}

# --- nodes ----------------------------------------------------------------------------------------

resource "openstack_compute_instance_v2" "node" {
  for_each = local.nodes

  name              = each.key
  flavor_name       = local.flavor[each.value.role]
  image_id          = local.volume_size > 0 ? null : local.image_id[each.value.role]
  key_pair          = openstack_compute_keypair_v2.run.name
  availability_zone = local.availability_zone
  user_data         = local.user_data

  metadata = {
    tfcluster         = var.cluster_name
    tfcluster_role    = each.value.role
    tfcluster_index   = tostring(each.value.index)
    tfcluster_storage = "s3://${var.bucket}/${var.prefix}/"
  }

  network {
    port = openstack_networking_port_v2.node[each.key].id
  }

  dynamic "block_device" {
    for_each = local.volume_size > 0 ? [1] : []
    content {
      uuid                  = local.image_id[each.value.role]
      source_type           = "image"
      destination_type      = "volume"
      volume_size           = local.volume_size
      boot_index            = 0
      delete_on_termination = true
    }
  }

  lifecycle {
    precondition {
      condition     = local.gpus[each.value.role] == 0 || lookup(var.instance_types, each.value.role, "") != ""
      error_message = "gpus.${each.value.role}: OpenStack attaches GPUs through the flavor; set instance_types.${each.value.role} to a GPU flavor of the site (PCI passthrough or vGPU)."
    }
  }

  depends_on = [
    openstack_networking_secgroup_rule_v2.ssh,
    openstack_networking_secgroup_rule_v2.tf_grpc,
    openstack_networking_router_interface_v2.cluster,
  ]
}
