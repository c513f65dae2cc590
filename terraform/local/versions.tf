terraform {
  # terraform_data (built in since 1.4) is the only resource: nothing is downloaded.
  required_version = ">= 1.4"
}
