# Cloud Run with one L4 GPU per instance. The container binds PORT (8080) at once and answers 503
# on /health until the model is downloaded and loaded: the startup probe is HTTP on /health (a TCP
# probe would pass before the model is ready).
#
# Cloud Run bounds the startup probe: failure_threshold x period_seconds at most 240 s, and
# initial_delay_seconds at most 240 s; past their sum the instance is shut down. So the model's
# download + load must fit in 240 s (no initial delay, the default) or 480 s (the full initial
# delay, which every cold start then waits out before its first probe, even a fast one). Beyond
# that: bake the GGUF into the image (cloud_run_model_baked), or keep cloud_run_min_instances >= 1
# so that cold starts are rare (they still have to fit).

variable "cloud_run_region" {
  description = "Region of the Cloud Run service; empty: var.region. Cloud Run has L4 GPUs in only some regions (us-central1, europe-west1, europe-west4, asia-southeast1; asia-south1 by invitation) and needs the 'without zonal redundancy' L4 quota there. The image and the model bucket stay in var.region: another region works, but every cold start then pulls and downloads across regions."
  type        = string
  default     = ""
}

variable "cloud_run_startup_initial_delay_seconds" {
  description = "Seconds before Cloud Run's first startup probe (0-240). Every cold start waits at least this long; raise it only for models whose download + load takes more than 240 s."
  type        = number
  default     = 0
  validation {
    condition     = var.cloud_run_startup_initial_delay_seconds >= 0 && var.cloud_run_startup_initial_delay_seconds <= 240 && floor(var.cloud_run_startup_initial_delay_seconds) == var.cloud_run_startup_initial_delay_seconds
    error_message = "Cloud Run allows an initial delay of 0 to 240 seconds."
  }
}

variable "cloud_run_startup_failure_threshold" {
  description = "Startup probes, 10 s apart, before Cloud Run gives up on a starting instance: 1-24 (Cloud Run caps failure_threshold x period at 240 s)."
  type        = number
  default     = 24
  validation {
    condition     = var.cloud_run_startup_failure_threshold >= 1 && var.cloud_run_startup_failure_threshold * 10 <= 240 && floor(var.cloud_run_startup_failure_threshold) == var.cloud_run_startup_failure_threshold
    error_message = "Cloud Run caps failure_threshold x period_seconds (10) at 240 s: use 1 to 24."
  }
}

variable "api_key_secret" {
  description = "Secret Manager secret (its id in this project, or projects/P/secrets/S) whose value is the Cloud Run service's API_KEY (one key, or several comma-separated): every request but the health probes then needs `Authorization: Bearer <key>` or `x-api-key: <key>`. null: no key (the service is guarded by invoker IAM only). Create the secret and its versions yourself: Terraform only grants the runtime account access, so the key never enters the state."
  type        = string
  default     = null
}

variable "api_key_secret_version" {
  description = "Version of api_key_secret the service reads at each instance start: latest, or a version number (pin it to roll keys with a new revision)."
  type        = string
  default     = "latest"
}

# The runtime account may read the API key's secret (and nothing else of Secret Manager).
resource "google_secret_manager_secret_iam_member" "runtime_reads_api_key" {
  count      = var.deploy_cloud_run && var.api_key_secret != null ? 1 : 0
  project    = var.project_id
  secret_id  = var.api_key_secret
  role       = "roles/secretmanager.secretAccessor"
  member     = "serviceAccount:${google_service_account.runtime.email}"
  depends_on = [google_project_service.apis] # secretmanager.googleapis.com
}

locals {
  cloud_run_region = var.cloud_run_region == "" ? var.region : var.cloud_run_region
  # The period the failure threshold's validation assumes (10 s).
  cloud_run_startup_period_seconds = 10
  # Where the container reads the model: the bucket, or the copy baked into the image.
  cloud_run_model = var.cloud_run_model_baked ? "/opt/model" : local.model_uri
}

# A warning at plan time, not an error: Google adds GPU regions.
check "cloud_run_gpu_region" {
  assert {
    condition     = !var.deploy_cloud_run || contains(["us-central1", "europe-west1", "europe-west4", "asia-southeast1", "asia-south1"], local.cloud_run_region)
    error_message = "Cloud Run region ${local.cloud_run_region} was not among the regions with L4 GPUs when this was written (us-central1, europe-west1, europe-west4, asia-southeast1, asia-south1): check https://cloud.google.com/run/docs/configuring/services/gpu before applying."
  }
}

resource "google_cloud_run_v2_service" "llm" {
  count               = var.deploy_cloud_run ? 1 : 0
  name                = var.cloud_run_service_name
  location            = local.cloud_run_region
  ingress             = "INGRESS_TRAFFIC_ALL"
  deletion_protection = false

  template {
    service_account                  = google_service_account.runtime.email
    timeout                          = "${var.request_timeout_seconds}s"
    max_instance_request_concurrency = var.cloud_run_concurrency
    gpu_zonal_redundancy_disabled    = true
    # Best effort: a reconnect carrying Cloud Run's affinity cookie tends to reach the same
    # instance, and so its resumable stream in memory (docs/streaming.md: resumable streams across replicas).
    session_affinity = var.cloud_run_session_affinity

    # Direct VPC egress (no connector), only to reach a Redis on the VPC (streams.tf): traffic to
    # private ranges goes through the VPC, everything else (Cloud Storage, Google APIs) as before.
    dynamic "vpc_access" {
      for_each = local.cloud_run_vpc_egress ? [1] : []
      content {
        egress = "PRIVATE_RANGES_ONLY"
        network_interfaces {
          network    = var.stream_store_network
          subnetwork = var.stream_store_subnetwork
        }
      }
    }

    scaling {
      min_instance_count = var.cloud_run_min_instances
      max_instance_count = var.cloud_run_max_instances
    }

    node_selector {
      accelerator = "nvidia-l4"
    }

    containers {
      image = local.image_by_digest

      ports {
        container_port = local.port
      }

      resources {
        limits = {
          cpu              = var.cloud_run_cpu
          memory           = var.cloud_run_memory
          "nvidia.com/gpu" = "1"
        }
        cpu_idle          = false
        startup_cpu_boost = true
      }

      env {
        name  = "MODEL"
        value = local.cloud_run_model
      }

      dynamic "env" {
        for_each = local.server_env
        content {
          name  = env.key
          value = env.value
        }
      }

      # Resumable streams: STREAM_STORE (streams.tf: the Memorystore instance, an existing Redis,
      # or unset: memory). The tuning variables come with server_env.
      dynamic "env" {
        for_each = local.cloud_run_stream_store_set ? ["STREAM_STORE"] : []
        content {
          name  = env.value
          value = local.cloud_run_stream_store
        }
      }

      # API keys from Secret Manager (never in the Terraform state or the service's config)
      dynamic "env" {
        for_each = var.api_key_secret == null ? [] : [var.api_key_secret]
        content {
          name = "API_KEY"
          value_source {
            secret_key_ref {
              secret  = env.value
              version = var.api_key_secret_version
            }
          }
        }
      }

      startup_probe {
        initial_delay_seconds = var.cloud_run_startup_initial_delay_seconds
        period_seconds        = local.cloud_run_startup_period_seconds
        timeout_seconds       = 5
        failure_threshold     = var.cloud_run_startup_failure_threshold
        http_get {
          path = local.health_route
          port = local.port
        }
      }

      liveness_probe {
        period_seconds    = 30
        timeout_seconds   = 10
        failure_threshold = 4
        http_get {
          path = local.health_route
          port = local.port
        }
      }
    }
  }

  depends_on = [
    google_project_service.apis,
    google_storage_bucket_iam_member.runtime_reads_models,
    google_artifact_registry_repository_iam_member.runtime_pulls_images,
    google_secret_manager_secret_iam_member.runtime_reads_api_key,
  ]
}

resource "google_cloud_run_v2_service_iam_member" "invokers" {
  for_each = var.deploy_cloud_run ? toset(var.allow_unauthenticated ? ["allUsers"] : var.cloud_run_invokers) : toset([])
  project  = var.project_id
  location = local.cloud_run_region
  name     = google_cloud_run_v2_service.llm[0].name
  role     = "roles/run.invoker"
  member   = each.value
}
