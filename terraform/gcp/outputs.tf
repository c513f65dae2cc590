output "nodes" {
  description = "The shared node list: name, role, index, private_ip, public_ip, ssh_user, ssh_port, gpus."
  value = [for n in local.ordered : {
    name       = "${var.cluster_name}-${n.role}-${n.index}"
    role       = n.role
    index      = n.index
    private_ip = google_compute_instance.node["${var.cluster_name}-${n.role}-${n.index}"].network_interface[0].network_ip
    public_ip = (local.public_ip ?
      google_compute_instance.node["${var.cluster_name}-${n.role}-${n.index}"].network_interface[0].access_config[0].nat_ip :
    google_compute_instance.node["${var.cluster_name}-${n.role}-${n.index}"].network_interface[0].network_ip)
    ssh_user = local.ssh_user
    ssh_port = 22
    gpus     = local.gpus[n.role]
  }]
}

output "service_account_email" {
  description = "The service account the nodes run as (created by the module unless provider_options.service_account_email named one)."
  value       = local.service_account_email
}

output "network" {
  description = "Self link or name of the network the nodes are on."
  value       = local.network
}
