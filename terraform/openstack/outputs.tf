output "nodes" {
  description = "The shared node list: name, role, index, private_ip, public_ip, ssh_user, ssh_port, gpus."
  value = [for n in local.ordered : {
    name       = "${var.cluster_name}-${n.role}-${n.index}"
    role       = n.role
    index      = n.index
    private_ip = local.private_ip["${var.cluster_name}-${n.role}-${n.index}"]
    public_ip = (local.floating_ip ?
      openstack_networking_floatingip_v2.node["${var.cluster_name}-${n.role}-${n.index}"].address :
    local.private_ip["${var.cluster_name}-${n.role}-${n.index}"])
    ssh_user = local.ssh_user
    ssh_port = 22
    gpus     = local.gpus[n.role]
  }]
  depends_on = [
    openstack_compute_instance_v2.node,
    openstack_networking_floatingip_associate_v2.node,
  ]
}

output "security_group_id" {
  description = "The security group on every node's port (SSH from allowed_ssh_cidrs, tf_port between members)."
  value       = openstack_networking_secgroup_v2.cluster.id
}

output "network_id" {
  description = "The network the nodes are on (created by the module unless provider_options.network named one)."
  value       = local.network_id
}
