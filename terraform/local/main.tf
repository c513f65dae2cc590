# Local provider: each node is a set of Linux namespaces on a private bridge, made and removed by
# tfcluster/localnode.py from terraform_data provisioners. The host-side names (bridge, veth and
# namespace prefixes, the cluster's memory cgroup) come from tfcluster through provider_options: one home
# for that rule. Destroy-time provisioners may read only self, so every input the teardown needs is kept
# in the resource's `input`.

locals {
  python    = var.provider_options["python"]
  state_dir = var.provider_options["state_dir"]
  subnet    = var.provider_options["subnet"]
  prefixlen = tonumber(split("/", local.subnet)[1])
  gateway   = cidrhost(local.subnet, 1)
  ssh_user  = var.ssh_user == "" ? "debian" : var.ssh_user
  apt_proxy = "http://${local.gateway}:3142"

  ordered = concat(
    [for i in range(var.ps_count) : { role = "ps", index = i }],
    [for i in range(var.worker_count) : { role = "worker", index = i }],
    [for i in range(var.chief_count) : { role = "chief", index = i }],
  )
  nodes = [for pos, n in local.ordered : {
    name       = "${var.cluster_name}-${n.role}-${n.index}"
    role       = n.role
    index      = n.index
    position   = pos
    private_ip = cidrhost(local.subnet, 10 + pos)
  }]
}

resource "terraform_data" "network" {
  input = {
    python       = local.python
    bridge       = var.provider_options["bridge"]
    gateway_cidr = "${local.gateway}/${local.prefixlen}"
    tf_port      = var.tf_port
  }

  provisioner "local-exec" {
    interpreter = [self.input.python, "-m", "tfcluster.localnode", "network-up"]
    command     = jsonencode(self.input)
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = [self.input.python, "-m", "tfcluster.localnode", "network-down"]
    command     = jsonencode(self.input)
  }
}

# The cluster's apt proxy (tfcluster/aptproxy.py) on the bridge's address: the nodes' only way to the
# Debian archive, as long as the cluster lives.
resource "terraform_data" "apt_proxy" {
  input = {
    python        = local.python
    listen_ip     = local.gateway
    port          = 3142
    cache_dir     = var.provider_options["apt_cache_dir"]
    state_dir     = local.state_dir
    bridge        = terraform_data.network.output.bridge
    clients       = local.subnet
    allowed_hosts = ["deb.debian.org"]
  }

  provisioner "local-exec" {
    interpreter = [self.input.python, "-m", "tfcluster.aptproxy", "start"]
    command     = jsonencode(self.input)
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = [self.input.python, "-m", "tfcluster.aptproxy", "stop"]
    command     = jsonencode(self.input)
  }
}

resource "terraform_data" "node" {
  for_each   = { for n in local.nodes : n.name => n }
  depends_on = [terraform_data.apt_proxy]

  input = {
    python         = local.python
    name           = each.value.name
    netns          = "${var.provider_options["netns_prefix"]}${each.value.name}"
    ip             = each.value.private_ip
    prefix_len     = local.prefixlen
    gateway_ip     = local.gateway
    bridge         = terraform_data.network.output.bridge
    veth           = format("%s%02x", var.provider_options["veth_prefix"], each.value.position)
    node_dir       = "${local.state_dir}/nodes/${each.value.name}"
    ssh_public_key = var.ssh_public_key
    ssh_user       = local.ssh_user
    image_root     = var.provider_options["image_root"]
    image_layer    = lookup(var.images, each.value.role, "")
    apt_proxy      = local.apt_proxy
    ssh_timeout    = lookup(var.provider_options, "ssh_timeout", "20")
    store_ip       = lookup(var.provider_options, "store_ip", "")
    cgroup         = "${var.provider_options["cgroup_parent"]}/${each.value.name}"
    memory_mb      = lookup(var.provider_options, "node_memory_mb", "")
  }

  provisioner "local-exec" {
    interpreter = [self.input.python, "-m", "tfcluster.localnode", "node-up"]
    command     = jsonencode(self.input)
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = [self.input.python, "-m", "tfcluster.localnode", "node-down"]
    command     = jsonencode(self.input)
  }
}
