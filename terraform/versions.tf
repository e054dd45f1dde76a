terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 7.8, < 8.0" # 7.8: google_redis_instance.deletion_protection (streams.tf)
    }
  }
}

provider "google" {
  project = var.project_id
  region  = var.region
}
