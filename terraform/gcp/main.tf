# GCP provider: one Compute Engine VM per node, a network (or an existing one), firewall rules that
# admit SSH only from allowed_ssh_cidrs and the TensorFlow gRPC port only between the cluster's own
# instances, and a dedicated service account whose only grants are the cluster's runs and its data.
#
# tfcluster's per-cluster root calls this module without provider configuration, so the module
# configures the google provider itself from provider_options (credentials: Application Default
# Credentials of whoever runs tfcluster; none pass through variables or state).

provider "google" {
  project = local.project
  region  = local.region
  zone    = local.zone
}

locals {
  roles = ["ps", "worker", "chief"]
  opts  = var.provider_options

  project     = lookup(local.opts, "project", "")
  zone        = lookup(local.opts, "zone", "us-central1-a")
  region      = lookup(local.opts, "region", "") != "" ? lookup(local.opts, "region", "") : regex("^(.+)-[a-z]$", local.zone)[0]
  preemptible = lookup(local.opts, "preemptible", "false") == "true"
  public_ip   = lookup(local.opts, "public_ip", "true") == "true"
  disk_size   = tonumber(lookup(local.opts, "disk_size_gb", "50"))
  disk_type   = lookup(local.opts, "disk_type", "pd-balanced")
  gpu_type    = lookup(local.opts, "gpu_type", "nvidia-tesla-t4")
  subnet_cidr = lookup(local.opts, "subnet_cidr", "10.20.0.0/24")

  # Resource names: "tfcluster-<cluster>" is 12-30 characters, a valid service-account id too.
  name     = "tfcluster-${var.cluster_name}"
  tag      = "tfcluster-${var.cluster_name}"
  ssh_user = var.ssh_user == "" ? "debian" : var.ssh_user # created by the guest agent from ssh-keys
  labels   = { tfcluster = var.cluster_name }

  create_network = lookup(local.opts, "network", "") == ""
  network        = local.create_network ? one(google_compute_network.cluster[*].self_link) : lookup(local.opts, "network", "")
  subnetwork = (local.create_network ? one(google_compute_subnetwork.cluster[*].self_link) :
  (lookup(local.opts, "subnetwork", "") == "" ? null : lookup(local.opts, "subnetwork", "")))

  create_service_account = lookup(local.opts, "service_account_email", "") == ""
  service_account_email = (local.create_service_account ? one(google_service_account.nodes[*].email) :
  lookup(local.opts, "service_account_email", ""))

  counts = { ps = var.ps_count, worker = var.worker_count, chief = var.chief_count }
  gpus   = { for r in local.roles : r => lookup(var.gpus, r, 0) }

  default_machine_type = { ps = "e2-standard-4", worker = "e2-standard-8", chief = "e2-standard-4" }
  machine_type = { for r in local.roles : r => (
    lookup(var.instance_types, r, "") != "" ? var.instance_types[r] :
    local.gpus[r] > 0 ? "n1-standard-8" : local.default_machine_type[r]
  ) }
  # Accelerator-optimized machine types come with their GPUs; N1 types take guest accelerators.
  bundled_gpus = { for r in local.roles : r => can(regex("^(a2|a3|a4|g2|g4)-", local.machine_type[r])) }
  attach_gpus  = { for r in local.roles : r => local.gpus[r] > 0 && startswith(local.machine_type[r], "n1-") }
  # GPUs and Spot VMs cannot live-migrate.
  on_host_maintenance = { for r in local.roles : r => (
    local.gpus[r] > 0 || local.bundled_gpus[r] || local.preemptible ? "TERMINATE" : "MIGRATE"
  ) }

  needs_default_image = anytrue([for r in local.roles : local.counts[r] > 0 && lookup(var.images, r, "") == ""])
  image = { for r in local.roles : r => (
    lookup(var.images, r, "") != "" ? var.images[r] : one(data.google_compute_image.debian[*].self_link)
  ) }

  # Runs at every boot; the node powers itself off after max_runtime_minutes plus an allowance for
  # configuration, a backstop: the run's deadline counts from the start of training, and the tf_node
  # role re-arms the halt then (deadline plus a margin). Compute Engine deletes the VM at the backstop
  # (scheduling.max_run_duration below), so it never comes before the run's own halt.
  configure_allowance_minutes = 60
  halt_after_minutes          = var.max_runtime_minutes + local.configure_allowance_minutes
  startup_script              = <<-EOT
    #!/bin/sh
    # tfcluster ${var.cluster_name}: backstop (max_runtime_minutes + configuration allowance)
    shutdown -h +${local.halt_after_minutes} "tfcluster: ${local.halt_after_minutes} minutes since boot"
  EOT

  ordered = concat(
    [for i in range(var.ps_count) : { role = "ps", index = i }],
    [for i in range(var.worker_count) : { role = "worker", index = i }],
    [for i in range(var.chief_count) : { role = "chief", index = i }],
  )
  nodes = { for n in local.ordered : "${var.cluster_name}-${n.role}-${n.index}" => n }
}

# Debian 12 (bookworm, Python 3.11): the newest image of family debian-12 in project debian-cloud.
data "google_compute_image" "debian" {
  count   = local.needs_default_image ? 1 : 0
  family  = "debian-12"
  project = "debian-cloud"
}

# --- network ------------------------------------------------------------------------------------

resource "google_compute_network" "cluster" {
  count                   = local.create_network ? 1 : 0
  name                    = local.name
  description             = "tfcluster ${var.cluster_name}: cluster network"
  auto_create_subnetworks = false
}

resource "google_compute_subnetwork" "cluster" {
  # checkov:skip=CKV_GCP_26:the subnet exists only while one training run does and carries only SSH from allowed_ssh_cidrs and gRPC between its VMs; flow logs would add a per-GB logging cost to every run
  count         = local.create_network ? 1 : 0
  name          = local.name
  region        = local.region
  network       = google_compute_network.cluster[0].id
  ip_cidr_range = local.subnet_cidr
  # Nodes without a public address still reach Cloud Storage.
  private_ip_google_access = true
}

# --- firewall: evaluated by priority, lowest number first ---------------------------------------

# SSH from the allowed networks only.
resource "google_compute_firewall" "ssh" {
  name          = "${local.name}-ssh"
  description   = "tfcluster ${var.cluster_name}: SSH from allowed_ssh_cidrs only"
  network       = local.network
  direction     = "INGRESS"
  priority      = 900
  source_ranges = var.allowed_ssh_cidrs
  target_tags   = [local.tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# The TensorFlow gRPC port (no authentication) from the cluster's own instances only.
resource "google_compute_firewall" "tf_grpc" {
  name        = "${local.name}-tf-grpc"
  description = "tfcluster ${var.cluster_name}: TensorFlow gRPC between cluster members only"
  network     = local.network
  direction   = "INGRESS"
  priority    = 900
  source_tags = [local.tag]
  target_tags = [local.tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.tf_port)]
  }
}

# Everything else to the cluster's instances is denied, above the priority (65534) of permissive
# rules such as the default network's default-allow-ssh and default-allow-internal.
resource "google_compute_firewall" "deny_ingress" {
  name          = "${local.name}-deny-ingress"
  description   = "tfcluster ${var.cluster_name}: deny all other ingress to the cluster's instances"
  network       = local.network
  direction     = "INGRESS"
  priority      = 1000
  source_ranges = ["0.0.0.0/0"]
  target_tags   = [local.tag]

  deny {
    protocol = "all"
  }
}

# --- identity: the nodes run as a service account limited to the cluster's runs and its data -------

resource "google_service_account" "nodes" {
  count        = local.create_service_account ? 1 : 0
  account_id   = local.name
  display_name = "tfcluster ${var.cluster_name} nodes"
  description  = "Identity of the nodes of tfcluster cluster ${var.cluster_name}: objects under gs://${var.bucket}/${var.storage_access.read_write} and its data (read only)."
}

# IAM conditions on a bucket need uniform bucket-level access; say so before any grant is tried.
data "google_storage_bucket" "granted" {
  for_each = local.create_service_account ? local.granted_buckets : toset([])
  name     = each.key
  lifecycle {
    postcondition {
      condition     = self.uniform_bucket_level_access == true
      error_message = "bucket ${each.key}: turn on uniform bucket-level access (gcloud storage buckets update gs://${each.key} --uniform-bucket-level-access): the nodes' grants carry IAM conditions, which buckets with ACLs do not take."
    }
  }
}

# What the nodes use (storage_access), with the IAM conditions of access.tf.
resource "google_storage_bucket_iam_member" "cluster_runs" {
  count  = local.create_service_account ? 1 : 0
  bucket = data.google_storage_bucket.granted[var.bucket].name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.nodes[0].email}"
  condition {
    title       = "tfcluster ${var.cluster_name} runs"
    description = "Objects under ${var.storage_access.read_write} and listings of them"
    expression  = local.cluster_runs_condition
  }
  lifecycle {
    precondition {
      condition     = startswith(var.storage_access.read_write, "${var.prefix}/")
      error_message = "storage_access.read_write ${var.storage_access.read_write} is not under prefix ${var.prefix}/: the nodes may write only inside the runs' prefix."
    }
  }
}

resource "google_storage_bucket_iam_member" "training_data" {
  for_each = local.create_service_account ? local.data_grants : {}
  bucket   = data.google_storage_bucket.granted[each.value.bucket].name
  role     = "roles/storage.objectViewer"
  member   = "serviceAccount:${google_service_account.nodes[0].email}"
  condition {
    title       = "tfcluster ${var.cluster_name} training data"
    description = "Objects under ${each.value.prefix == "" ? "(the whole bucket)" : each.value.prefix}, read only"
    expression  = each.value.condition
  }
}

# --- nodes ----------------------------------------------------------------------------------------

resource "google_compute_instance" "node" {
  # checkov:skip=CKV_GCP_38:customer-supplied keys would be key material the user must generate, keep and pass to every run; the disks hold the OS, the venv and transient checkpoints (the model goes to the bucket) and are encrypted at rest with Google-managed keys
  # checkov:skip=CKV_GCP_40:the controller reaches the nodes over SSH through their public address; the firewall admits SSH only from network.allowed_ssh_cidrs and gRPC only between cluster VMs, and provider_options.public_ip false drops the address where the network has Cloud NAT
  for_each = local.nodes

  name         = each.key
  machine_type = local.machine_type[each.value.role]
  zone         = local.zone
  tags         = [local.tag]
  labels       = merge(local.labels, { tfcluster-role = each.value.role })

  boot_disk {
    auto_delete = true
    initialize_params {
      image  = local.image[each.value.role]
      size   = local.disk_size
      type   = local.disk_type
      labels = local.labels
    }
  }

  network_interface {
    network    = local.network
    subnetwork = local.subnetwork

    dynamic "access_config" {
      for_each = local.public_ip ? [1] : []
      content {}
    }
  }

  dynamic "guest_accelerator" {
    for_each = local.attach_gpus[each.value.role] ? [1] : []
    content {
      type  = local.gpu_type
      count = local.gpus[each.value.role]
    }
  }

  # Shielded VM: measured boot (vTPM) and integrity monitoring on every node; Secure Boot on nodes without
  # GPUs, as the NVIDIA module gpu_driver builds with DKMS is signed by no key the firmware trusts. Needs a
  # UEFI-compatible image: Debian 12's (the default) is, as are the major distributions' public images.
  shielded_instance_config {
    enable_secure_boot          = local.gpus[each.value.role] == 0 && !local.bundled_gpus[each.value.role]
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  scheduling {
    provisioning_model          = local.preemptible ? "SPOT" : "STANDARD"
    preemptible                 = local.preemptible
    automatic_restart           = false
    on_host_maintenance         = local.on_host_maintenance[each.value.role]
    instance_termination_action = "DELETE"
    max_run_duration {
      seconds = local.halt_after_minutes * 60
    }
  }

  # Only the roles whose tasks use storage run as the account; a ps VM has no service account at all.
  dynamic "service_account" {
    for_each = contains(var.storage_access.jobs, each.value.role) ? [local.service_account_email] : []
    content {
      email  = service_account.value
      scopes = ["https://www.googleapis.com/auth/devstorage.read_write"]
    }
  }

  metadata = {
    ssh-keys               = "${local.ssh_user}:${trimspace(var.ssh_public_key)}"
    block-project-ssh-keys = "true"
    enable-oslogin         = "FALSE"
    startup-script         = local.startup_script
    tfcluster-cluster      = var.cluster_name
    tfcluster-role         = each.value.role
    tfcluster-index        = tostring(each.value.index)
    tfcluster-storage      = "gs://${var.bucket}/${var.prefix}/"
  }

  lifecycle {
    precondition {
      condition     = local.gpus[each.value.role] == 0 || startswith(local.machine_type[each.value.role], "n1-") || local.bundled_gpus[each.value.role]
      error_message = "gpus.${each.value.role}: GPUs need an N1 machine type (guest accelerators) or an accelerator-optimized one (a2-, a3-, a4-, g2-, g4-); instance_types.${each.value.role} is ${local.machine_type[each.value.role]}."
    }
    precondition {
      condition     = !local.bundled_gpus[each.value.role] || local.gpus[each.value.role] > 0
      error_message = "gpus.${each.value.role}: machine type ${local.machine_type[each.value.role]} comes with GPUs; set gpus.${each.value.role} to their number so the nodes are configured for them."
    }
  }

  depends_on = [
    google_compute_firewall.ssh,
    google_compute_firewall.tf_grpc,
    google_compute_firewall.deny_ingress,
    google_storage_bucket_iam_member.cluster_runs,
    google_storage_bucket_iam_member.training_data,
  ]
}
