terraform {
  # strcontains() needs 1.5; the aws provider is pinned: on these machines it comes from the
  # filesystem mirror /opt/tf-plugins (no download).
  required_version = ">= 1.5, < 2.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "5.100.0"
    }
  }
}
