# Vertex AI: an endpoint (Terraform resource) and the model upload + deployment, which the google
# provider has no resource for (the endpoint's deployed_models is output-only): gcloud, run by
# scripts/vertex_deploy.sh from terraform_data, replaced whenever the image or model changes.

resource "google_vertex_ai_endpoint" "llm" {
  # checkov:skip=CKV2_GCP_33:a public (dedicated) endpoint still requires IAM-authenticated calls; a private one needs VPC peering this module does not create
  # checkov:skip=CKV2_GCP_24:predictions are not stored; Google-managed encryption is enough (add encryption_spec for CMEK)
  count                      = var.deploy_vertex ? 1 : 0
  name                       = "vertex-gguf"
  display_name               = "vertex-gguf"
  location                   = var.region
  dedicated_endpoint_enabled = var.vertex_dedicated_endpoint
  depends_on                 = [google_project_service.apis]
}

resource "terraform_data" "vertex_deployment" {
  count = var.deploy_vertex ? 1 : 0

  triggers_replace = {
    image            = local.image
    model_uri        = local.model_uri
    machine_type     = var.vertex_machine_type
    accelerator      = "${var.vertex_accelerator_type}:${var.vertex_accelerator_count}"
    replicas         = "${var.vertex_min_replicas}-${var.vertex_max_replicas}"
    env              = jsonencode(local.server_env)
    endpoint_id      = google_vertex_ai_endpoint.llm[0].name
    project          = var.project_id
    region           = var.region
    service_account  = google_service_account.runtime.email
    port             = local.port
    health_route     = local.health_route
    predict_route    = local.predict_route
    deploy_timeout_s = var.deployment_timeout_seconds
  }

  provisioner "local-exec" {
    command = "${path.module}/scripts/vertex_deploy.sh deploy"
    environment = {
      PROJECT            = var.project_id
      REGION             = var.region
      ENDPOINT_ID        = google_vertex_ai_endpoint.llm[0].name
      IMAGE              = local.image
      ARTIFACT_URI       = local.model_uri
      DISPLAY_NAME       = "vertex-gguf-${substr(sha1(jsonencode(self.triggers_replace)), 0, 8)}"
      PORT               = local.port
      HEALTH_ROUTE       = local.health_route
      PREDICT_ROUTE      = local.predict_route
      ENV_VARS           = join(",", [for k, v in local.server_env : "${k}=${v}"])
      MACHINE_TYPE       = var.vertex_machine_type
      ACCELERATOR        = "type=${lower(replace(var.vertex_accelerator_type, "_", "-"))},count=${var.vertex_accelerator_count}"
      MIN_REPLICAS       = var.vertex_min_replicas
      MAX_REPLICAS       = var.vertex_max_replicas
      SERVICE_ACCOUNT    = google_service_account.runtime.email
      DEPLOY_TIMEOUT_S   = var.deployment_timeout_seconds
      STARTUP_PROBE_EXEC = "vertex-gguf,probe"
    }
  }

  provisioner "local-exec" {
    when    = destroy
    command = "${path.module}/scripts/vertex_deploy.sh undeploy"
    environment = {
      PROJECT     = self.triggers_replace.project
      REGION      = self.triggers_replace.region
      ENDPOINT_ID = self.triggers_replace.endpoint_id
    }
  }

  depends_on = [
    google_storage_bucket_iam_member.runtime_reads_models,
    google_artifact_registry_repository_iam_member.runtime_pulls_images,
  ]
}
