output "nodes" {
  description = "The shared node list: name, role, index, private_ip, public_ip, ssh_user, ssh_port, gpus."
  value = [for n in local.nodes : {
    name       = n.name
    role       = n.role
    index      = n.index
    private_ip = n.private_ip
    public_ip  = n.private_ip
    ssh_user   = local.ssh_user
    ssh_port   = 22
    gpus       = 0
  }]
  depends_on = [terraform_data.node]
}
