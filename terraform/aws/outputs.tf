output "nodes" {
  description = "The shared node list: name, role, index, private_ip, public_ip, ssh_user, ssh_port, gpus (public_ip = private_ip without a public address)."
  value = [for n in local.nodes : {
    name       = n.name
    role       = n.role
    index      = n.index
    private_ip = aws_instance.node[n.name].private_ip
    public_ip  = aws_instance.node[n.name].public_ip != "" ? aws_instance.node[n.name].public_ip : aws_instance.node[n.name].private_ip
    ssh_user   = local.ssh_user
    ssh_port   = 22
    gpus       = local.gpus[n.role]
  }]
}

output "security_group_id" {
  description = "The cluster's security group (SSH from allowed_ssh_cidrs, tf_port between members)."
  value       = aws_security_group.cluster.id
}

output "vpc_id" {
  description = "The VPC the nodes are in (created or given)."
  value       = local.vpc_id
}

output "subnet_id" {
  description = "The subnet the nodes are in (created or given)."
  value       = local.subnet_id
}

output "instance_profile" {
  description = "The instance profile of the nodes in storage_access.jobs (S3: their cluster's runs, and their data read only)."
  value       = aws_iam_instance_profile.node.name
}

output "images" {
  description = "AMI id per role in use."
  value       = local.image
}
