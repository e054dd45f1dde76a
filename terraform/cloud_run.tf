# Cloud Run with one L4 GPU per instance. The container binds PORT (8080) at once and answers 503
# on /health until the model is downloaded and loaded: the startup probe is HTTP on /health (a TCP
# probe would pass before the model is ready).

resource "google_cloud_run_v2_service" "llm" {
  count               = var.deploy_cloud_run ? 1 : 0
  name                = var.cloud_run_service_name
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_ALL"
  deletion_protection = false

  template {
    service_account                  = google_service_account.runtime.email
    timeout                          = "${var.request_timeout_seconds}s"
    max_instance_request_concurrency = var.cloud_run_concurrency
    gpu_zonal_redundancy_disabled    = true

    scaling {
      min_instance_count = var.cloud_run_min_instances
      max_instance_count = var.cloud_run_max_instances
    }

    node_selector {
      accelerator = "nvidia-l4"
    }

    containers {
      image = local.image

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
        value = local.model_uri
      }

      dynamic "env" {
        for_each = local.server_env
        content {
          name  = env.key
          value = env.value
        }
      }

      startup_probe {
        initial_delay_seconds = 0
        period_seconds        = 10
        timeout_seconds       = 5
        failure_threshold     = var.startup_probe_failure_threshold
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
  ]
}

resource "google_cloud_run_v2_service_iam_member" "invokers" {
  for_each = var.deploy_cloud_run ? toset(var.allow_unauthenticated ? ["allUsers"] : var.cloud_run_invokers) : toset([])
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.llm[0].name
  role     = "roles/run.invoker"
  member   = each.value
}
