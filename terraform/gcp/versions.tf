terraform {
  # startswith/strcontains need 1.5.
  required_version = ">= 1.5.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # Pinned exactly: scheduling.max_run_duration and instance_termination_action are GA here.
      version = "7.45.0"
    }
  }
}
