# What the nodes' service account may use, as IAM conditions on object names. tfcluster/access.py states
# it (storage_access): the cluster's runs, as objects and as listings under their prefix (IAM sees a
# listing as a request on the bucket, whose prefix is the objectListPrefix attribute), and the data, which
# the nodes only read and never list (the controller lists it and hands each task its keys).
# Only variables are used here, so tests/static evaluates these expressions with Terraform alone.

locals {
  cluster_runs_condition = join(" || ", [
    "resource.name.startsWith(\"projects/_/buckets/${var.bucket}/objects/${var.storage_access.read_write}\")",
    "api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${var.storage_access.read_write}\")",
  ])
  data_grants = { for g in var.storage_access.read : "${g.bucket}/${g.prefix}" => merge(g, {
    condition = "resource.name.startsWith(\"projects/_/buckets/${g.bucket}/objects/${g.prefix}\")"
  }) }
  # every bucket granted on, whose uniform bucket-level access main.tf checks (conditions need it)
  granted_buckets = toset(concat([var.bucket], [for g in var.storage_access.read : g.bucket]))
}
