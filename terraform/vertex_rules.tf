# Vertex AI values and plan-time checks that depend on variables only (no provider), so that
# tests/test_deploy_vertex.py can run them through `terraform plan` offline.

locals {
  # GPUs each Vertex AI prediction machine type carries (type, count): the deployment asks for
  # exactly these; a machine type missing here needs vertex_accelerator_type and _count set.
  vertex_gpus = {
    "g2-standard-4"  = { type = "NVIDIA_L4", count = 1 }
    "g2-standard-8"  = { type = "NVIDIA_L4", count = 1 }
    "g2-standard-12" = { type = "NVIDIA_L4", count = 1 }
    "g2-standard-16" = { type = "NVIDIA_L4", count = 1 }
    "g2-standard-24" = { type = "NVIDIA_L4", count = 2 }
    "g2-standard-32" = { type = "NVIDIA_L4", count = 1 }
    "g2-standard-48" = { type = "NVIDIA_L4", count = 4 }
    "g2-standard-96" = { type = "NVIDIA_L4", count = 8 }
    "a2-highgpu-1g"  = { type = "NVIDIA_TESLA_A100", count = 1 }
    "a2-highgpu-2g"  = { type = "NVIDIA_TESLA_A100", count = 2 }
    "a2-highgpu-4g"  = { type = "NVIDIA_TESLA_A100", count = 4 }
    "a2-highgpu-8g"  = { type = "NVIDIA_TESLA_A100", count = 8 }
    "a2-megagpu-16g" = { type = "NVIDIA_TESLA_A100", count = 16 }
    "a2-ultragpu-1g" = { type = "NVIDIA_A100_80GB", count = 1 }
    "a2-ultragpu-2g" = { type = "NVIDIA_A100_80GB", count = 2 }
    "a2-ultragpu-4g" = { type = "NVIDIA_A100_80GB", count = 4 }
    "a2-ultragpu-8g" = { type = "NVIDIA_A100_80GB", count = 8 }
    "a3-highgpu-1g"  = { type = "NVIDIA_H100_80GB", count = 1 }
    "a3-highgpu-2g"  = { type = "NVIDIA_H100_80GB", count = 2 }
    "a3-highgpu-4g"  = { type = "NVIDIA_H100_80GB", count = 4 }
    "a3-highgpu-8g"  = { type = "NVIDIA_H100_80GB", count = 8 }
    "a3-megagpu-8g"  = { type = "NVIDIA_H100_MEGA_80GB", count = 8 }
    "a3-ultragpu-8g" = { type = "NVIDIA_H200_141GB", count = 8 }
  }
  vertex_machine_gpus      = lookup(local.vertex_gpus, var.vertex_machine_type, null)
  vertex_accelerator_type  = var.vertex_accelerator_type != null ? var.vertex_accelerator_type : (local.vertex_machine_gpus != null ? local.vertex_machine_gpus.type : null)
  vertex_accelerator_count = var.vertex_accelerator_count != null ? var.vertex_accelerator_count : (local.vertex_machine_gpus != null ? local.vertex_machine_gpus.count : null)

  # A dedicated endpoint cuts a request at 10 minutes unless it was created with a longer
  # clientConnectionConfig.inferenceTimeout, which google_vertex_ai_endpoint cannot set. So the
  # server is told the real limit: its REQUEST_TIMEOUT ends a generation 10 s before the platform
  # would, with the clean timeout error (a 504, or an error event mid-stream).
  vertex_inference_timeout_s = 600
  vertex_request_timeout_s   = local.vertex_inference_timeout_s - 10

  # The time a replica has to download and load the model before Vertex restarts it.
  vertex_startup_budget_s = var.vertex_startup_probe.period_seconds * var.vertex_startup_probe.failure_threshold

  # How long the deploy script waits for each long-running operation: a deployment gets the
  # deployment timeout plus 30 minutes for machines and the image pull; the others 30 minutes.
  vertex_deploy_wait_s = var.deployment_timeout_seconds + 1800
  vertex_op_wait_s     = 1800

  # Endpoint id: a number derived from what forces a new endpoint, so a replacement (created
  # before the old one is destroyed) never asks for the id the old one still holds.
  vertex_endpoint_id = var.vertex_endpoint_id != "" ? var.vertex_endpoint_id : tostring(parseint(substr(sha1("vertex-gguf/${var.project_id}/${var.region}/${var.vertex_dedicated_endpoint}"), 0, 8), 16))
}

# Checks between variables, at plan time (validation blocks can name one variable only before
# Terraform 1.9). Nothing is created.
resource "terraform_data" "vertex_rules" {
  count = var.deploy_vertex ? 1 : 0

  input = {
    machine_type      = var.vertex_machine_type
    accelerator_type  = local.vertex_accelerator_type
    accelerator_count = local.vertex_accelerator_count
  }

  lifecycle {
    precondition {
      condition     = local.vertex_accelerator_type != null && local.vertex_accelerator_count != null
      error_message = "vertex_machine_type ${var.vertex_machine_type} is not in vertex_gpus (vertex_rules.tf): set vertex_accelerator_type and vertex_accelerator_count for it."
    }
    precondition {
      condition     = local.vertex_machine_gpus == null ? true : (local.vertex_accelerator_type == local.vertex_machine_gpus.type && local.vertex_accelerator_count == local.vertex_machine_gpus.count)
      error_message = "vertex_machine_type ${var.vertex_machine_type} carries ${local.vertex_machine_gpus == null ? "" : "${local.vertex_machine_gpus.count} x ${local.vertex_machine_gpus.type}"}: leave vertex_accelerator_type and vertex_accelerator_count null, or set exactly that."
    }
    precondition {
      condition     = !var.vertex_invoke_routes || var.vertex_dedicated_endpoint
      error_message = "vertex_invoke_routes needs vertex_dedicated_endpoint = true: Vertex AI deploys an invoke-enabled Model to a dedicated endpoint only."
    }
    precondition {
      condition     = var.vertex_max_replicas >= var.vertex_min_replicas
      error_message = "vertex_max_replicas must be >= vertex_min_replicas."
    }
    precondition {
      condition     = local.vertex_startup_budget_s <= var.deployment_timeout_seconds
      error_message = "The startup probe's budget (period_seconds x failure_threshold = ${local.vertex_startup_budget_s} s) exceeds deployment_timeout_seconds (${var.deployment_timeout_seconds} s), which ends the deployment first: lower failure_threshold or raise the timeout (at most 7200)."
    }
  }
}
