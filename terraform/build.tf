# The build side: the identity Cloud Build runs as (only what a build needs), the bucket
# `gcloud builds submit` stages the source in, and the image reference by digest that the
# deployments run. scripts/deploy.sh applies the resources here first (with the APIs, the
# repository and the model bucket), then builds, then applies the rest.

variable "cloud_run_model_baked" {
  description = "Serve the GGUF baked into the image at /opt/model (cloudbuild.yaml's _BAKE_MODEL copies it from the model bucket at build time) instead of downloading it from the bucket at start-up: for models too big to download within Cloud Run's startup window."
  type        = bool
  default     = false
}

locals {
  # The bucket gcloud uploads the build context to (the default, PROJECT_cloudbuild, is created
  # on first use and would need a grant Terraform cannot make before it exists).
  build_source_bucket = "${var.project_id}-vertex-gguf-build"

  # The image both deployments run, pinned by digest: REGION-docker.pkg.dev/PROJECT/REPO/IMAGE@sha256:...
  # A rebuild that moves the tag changes this value, so the next apply rolls out the new image
  # (a new Cloud Run revision, a new Vertex deployment); an apply without a rebuild changes
  # nothing, whatever the registry's tag points at meanwhile. null when neither platform is deployed.
  image_by_digest = one(data.google_artifact_registry_docker_image.app[*].self_link)
}

# The tag cloudbuild.yaml pushed (local.image), resolved to its digest at plan time. A plan before
# the first build fails here, naming the missing image, rather than deploying a tag that does
# not exist.
data "google_artifact_registry_docker_image" "app" {
  count         = var.deploy_cloud_run || var.deploy_vertex ? 1 : 0
  location      = google_artifact_registry_repository.images.location
  repository_id = google_artifact_registry_repository.images.repository_id
  image_name    = "${var.image_name}:${var.image_tag}"
}

# Cloud Build runs as this account, not as the project's default build account (which can
# hold broad roles such as Editor). cloudbuild.yaml names it in `serviceAccount:` and, because
# a user-specified account cannot write to the default logs bucket, logs to Cloud Logging only.
resource "google_service_account" "build" {
  account_id   = "vertex-gguf-build"
  display_name = "vertex-gguf Cloud Build"
  depends_on   = [google_project_service.apis]
}

# Push the image and the `buildcache` layers, in this repository only.
resource "google_artifact_registry_repository_iam_member" "build_pushes_images" {
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.writer"
  member     = "serviceAccount:${google_service_account.build.email}"
}

# Write the build's logs (options.logging: CLOUD_LOGGING_ONLY).
resource "google_project_iam_member" "build_writes_logs" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.build.email}"
}

resource "google_storage_bucket" "build_sources" {
  # checkov:skip=CKV_GCP_62:access logs for staged build sources are not needed
  # checkov:skip=CKV_GCP_78:staged sources are throwaway copies of the repository; versioning would only keep more of them
  name                        = local.build_source_bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  lifecycle_rule {
    condition {
      age = 7
    }
    action {
      type = "Delete"
    }
  }
  depends_on = [google_project_service.apis]
}

# Read the source tarball gcloud staged.
resource "google_storage_bucket_iam_member" "build_reads_sources" {
  bucket = google_storage_bucket.build_sources.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.build.email}"
}

# Read the model, only when it is baked into the image.
resource "google_storage_bucket_iam_member" "build_reads_models" {
  count  = var.cloud_run_model_baked ? 1 : 0
  bucket = google_storage_bucket.models.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.build.email}"
}

# What scripts/deploy.sh reads after the first, targeted apply. Each output refers to a resource
# that apply creates: after `apply -target=...` Terraform updates only the outputs it can derive
# from the targeted resources.

output "image_by_digest" {
  description = "The image both platforms run, pinned by digest (REGION-docker.pkg.dev/PROJECT/REPO/IMAGE@sha256:...)."
  value       = local.image_by_digest
}

output "build_project" {
  description = "Project the image is built in (gcloud builds submit --project)."
  value       = google_service_account.build.project
}

output "build_service_account" {
  description = "Service account Cloud Build runs as (cloudbuild.yaml's serviceAccount)."
  value       = google_service_account.build.email
}

output "build_source_staging_dir" {
  description = "Where gcloud builds submit stages the source (--gcs-source-staging-dir)."
  value       = "gs://${google_storage_bucket.build_sources.name}/source"
}

output "build_substitutions" {
  description = "cloudbuild.yaml substitutions matching this configuration (gcloud builds submit --substitutions)."
  value = join(",", [
    "_REGION=${google_artifact_registry_repository.images.location}",
    "_REPOSITORY=${google_artifact_registry_repository.images.repository_id}",
    "_IMAGE=${var.image_name}",
    "_TAG=${var.image_tag}",
    "_BUILD_SERVICE_ACCOUNT=${google_service_account.build.account_id}",
  ])
}
