locals {
  # The same reference cloudbuild.yaml pushes: ${_REGION}-docker.pkg.dev/${PROJECT_ID}/${_REPOSITORY}/${_IMAGE}:${_TAG}
  # (a mutable tag: the deployments run local.image_by_digest, build.tf, which resolves it).
  image     = "${var.region}-docker.pkg.dev/${var.project_id}/${var.repository}/${var.image_name}:${var.image_tag}"
  model_uri = "gs://${google_storage_bucket.models.name}/${var.model_path}"
  # The server's own routes (app/settings/serving.py defaults) and port.
  port          = 8080
  health_route  = "/health"
  predict_route = "/predict"
  server_env = merge(
    {
      REQUEST_TIMEOUT = tostring(var.request_timeout_seconds - 10)
      # Cloud Logging structured entries (severity, trace, httpRequest); the project makes the
      # trace field projects/<id>/traces/<trace>, so log lines group under their request's trace
      LOG_FORMAT           = "json"
      GOOGLE_CLOUD_PROJECT = var.project_id
    },
    var.model_file == "" ? {} : { MODEL_FILE = var.model_file },
    local.stream_tuning_env, # STREAM_BUFFER_BYTES, STREAM_SESSION_TTL when set (streams_rules.tf)
  )
}

# The APIs, the repository and the model bucket are created by the first, targeted apply of
# scripts/deploy.sh, before anything is built: nothing else creates them (no `gcloud artifacts
# repositories create`, no `gcloud services enable`), so none is created twice.
resource "google_project_service" "apis" {
  for_each = toset(concat(
    [
      "aiplatform.googleapis.com",
      "artifactregistry.googleapis.com",
      "cloudbuild.googleapis.com",
      "iam.googleapis.com",
      "logging.googleapis.com",
      "run.googleapis.com",
      "storage.googleapis.com",
    ],
    var.api_key_secret == null ? [] : ["secretmanager.googleapis.com"],
    # Resumable streams (streams.tf): Memorystore, and the Compute Engine network that Cloud
    # Run's Direct VPC egress joins
    var.stream_store_redis ? ["redis.googleapis.com"] : [],
    local.cloud_run_vpc_egress ? ["compute.googleapis.com"] : [],
  ))
  service            = each.value
  disable_on_destroy = false
}

variable "registry_untagged_retention_days" {
  description = "Artifact Registry cleanup: delete image versions (manifests) that no tag points at any more once they are this many days old: the images a rebuild of the same tag replaced, and the build cache manifests each build's `buildcache` replaced (multi-GB CUDA layers). The most recent registry_keep_recent_versions versions are kept whatever their age."
  type        = number
  default     = 14
  validation {
    condition     = var.registry_untagged_retention_days >= 1 && var.registry_untagged_retention_days <= 3650 && floor(var.registry_untagged_retention_days) == var.registry_untagged_retention_days
    error_message = "registry_untagged_retention_days must be a whole number of days, 1 to 3650."
  }
}

variable "registry_keep_recent_versions" {
  description = "Artifact Registry cleanup: the most recent versions of the image (tagged or not: images and `buildcache` manifests, about two per build) that are never deleted, so a recently replaced digest (one a running revision or deployment may still use, a rollback target) survives the untagged rule."
  type        = number
  default     = 10
  validation {
    condition     = var.registry_keep_recent_versions >= 2 && floor(var.registry_keep_recent_versions) == var.registry_keep_recent_versions
    error_message = "registry_keep_recent_versions must be a whole number >= 2 (the image and its build cache)."
  }
}

locals {
  # older_than is a duration in seconds.
  registry_untagged_older_than = "${var.registry_untagged_retention_days * 86400}s"
}

resource "google_artifact_registry_repository" "images" {
  # checkov:skip=CKV_GCP_84:images hold public code and no data; Google-managed encryption is enough (add kms_key_name for CMEK)
  location      = var.region
  repository_id = var.repository
  format        = "DOCKER"
  description   = "vertex-gguf images"

  # Cleanup (applied by Artifact Registry about once a day; a version matching a KEEP policy is
  # never deleted, whatever DELETE policy matches it too). Only untagged versions are deleted:
  # anything a tag points at stays, the deployed image_tag and `buildcache` above all; the
  # keep-tagged-image policy says so explicitly, so a broader DELETE policy added later cannot
  # remove the tag the deployments resolve.
  cleanup_policy_dry_run = false
  cleanup_policies {
    id     = "delete-untagged"
    action = "DELETE"
    condition {
      tag_state  = "UNTAGGED"
      older_than = local.registry_untagged_older_than
    }
  }
  cleanup_policies {
    id     = "keep-tagged-image"
    action = "KEEP"
    condition {
      tag_state    = "TAGGED"
      tag_prefixes = [var.image_tag]
    }
  }
  cleanup_policies {
    id     = "keep-recent-versions"
    action = "KEEP"
    most_recent_versions {
      package_name_prefixes = [var.image_name]
      keep_count            = var.registry_keep_recent_versions
    }
  }

  depends_on = [google_project_service.apis]
}

resource "google_storage_bucket" "models" {
  # checkov:skip=CKV_GCP_62:access logs for a bucket of model weights are optional; enable them with your own log bucket
  name                        = var.model_bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false
  versioning {
    enabled = true
  }
  depends_on = [google_project_service.apis]
}

# The identity both platforms run the container as: reads the model bucket, pulls the image.
resource "google_service_account" "runtime" {
  account_id   = "vertex-gguf-runtime"
  display_name = "vertex-gguf runtime"
  depends_on   = [google_project_service.apis] # iam.googleapis.com, on a fresh project
}

resource "google_storage_bucket_iam_member" "runtime_reads_models" {
  bucket = google_storage_bucket.models.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.runtime.email}"
}

resource "google_artifact_registry_repository_iam_member" "runtime_pulls_images" {
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.reader"
  member     = "serviceAccount:${google_service_account.runtime.email}"
}
