terraform {
  # terraform_data (built in since 1.4) is the only resource: nothing is downloaded; strcontains needs 1.5.
  required_version = ">= 1.5"
}
