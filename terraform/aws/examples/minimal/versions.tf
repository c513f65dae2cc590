terraform {
  required_version = ">= 1.5, < 2.0"
}
