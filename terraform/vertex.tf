# Vertex AI: an endpoint (Terraform resource) and the model upload + deployment, which the google
# provider has no resource for (the endpoint's deployed_models is output-only): the Vertex AI REST
# API, called by scripts/vertex_deploy.sh from terraform_data.
#
# Rollout without an outage: any change to the image, model, machine, env or probe replaces
# terraform_data.vertex_deployment, and create_before_destroy makes Terraform run the new
# instance's deploy (upload a Model, deploy it beside the old one, and move all traffic to it once
# it is healthy) before the old instance's destroy (undeploy exactly its own deployed model and
# delete its own Model). Both steps name the deployed model by an id computed from the instance's
# inputs and its Terraform id, the same expression at create and at destroy, so a destroy never
# touches another deployment. For the rollout's duration both deployments run: the GPU quota must
# cover twice the replicas' GPUs (or accept a failed apply when it does not: the old deployment
# keeps serving).

locals {
  # The container's env on Vertex: the shared server env, the model read straight from the bucket
  # (as on Cloud Run) and the request timeout under Vertex's own 10-minute limit.
  vertex_env = merge(local.server_env, {
    MODEL           = local.model_uri
    REQUEST_TIMEOUT = tostring(local.vertex_request_timeout_s)
    },
    # Resumable streams: a Redis reachable from the internet, or unset (memory). Vertex endpoints
    # have no way into the VPC for this deployment's endpoint type (streams_rules.tf).
    var.vertex_stream_store == null ? {} : { STREAM_STORE = var.vertex_stream_store },
  )

  # models.upload body (v1 REST); __MODEL_ID__ is filled in by the script.
  vertex_upload_body = jsonencode({
    modelId = "__MODEL_ID__"
    model = {
      displayName = "__MODEL_ID__"
      labels      = { app = "vertex-gguf", managed-by = "terraform" }
      containerSpec = merge({
        imageUri          = local.image_by_digest
        env               = [for k, v in local.vertex_env : { name = k, value = v }]
        ports             = [{ containerPort = local.port }]
        healthRoute       = local.health_route
        deploymentTimeout = "${var.deployment_timeout_seconds}s"
        startupProbe = {
          httpGet          = { path = local.health_route, port = local.port }
          periodSeconds    = var.vertex_startup_probe.period_seconds
          timeoutSeconds   = var.vertex_startup_probe.timeout_seconds
          failureThreshold = var.vertex_startup_probe.failure_threshold
        }
        },
        # The predict route (predict, rawPredict, streamRawPredict), or, with vertex_invoke_routes,
        # Vertex's invoke method instead: POST .../invoke/PATH reaches PATH on the container, and
        # :predict, :rawPredict and the other methods are off. Google ("Use arbitrary custom
        # routes", preview): "/*" is the only value, dedicated endpoints only, and only one of
        # predictRoute and invokeRoutePrefix may be set.
        var.vertex_invoke_routes ? { invokeRoutePrefix = "/*" } : { predictRoute = local.predict_route },
      )
    }
  })

  # Autoscaling on the GPU duty cycle, only when a target is set: without one the body carries no
  # autoscalingMetricSpecs (Vertex's default), as before the variable existed, so adding the
  # variable rolls out nothing. (A map from a for expression: a conditional between {} and an
  # object with attributes would not type-check.)
  vertex_autoscaling = {
    for k, v in {
      autoscalingMetricSpecs = [{
        metricName = "aiplatform.googleapis.com/prediction/online/accelerator/duty_cycle"
        target     = var.vertex_autoscaling_gpu_duty_cycle
      }]
    } : k => v if var.vertex_autoscaling_gpu_duty_cycle != null
  }

  # endpoints.deployModel body; trafficSplit {"0": 100} gives the new deployment all traffic when
  # it is ready (and 0 to every other one), in the same operation.
  vertex_deploy_body = jsonencode({
    deployedModel = {
      id             = "__DEPLOYED_MODEL_ID__"
      model          = "projects/${var.project_id}/locations/${var.region}/models/__MODEL_ID__"
      displayName    = "__MODEL_ID__"
      serviceAccount = google_service_account.runtime.email
      dedicatedResources = merge({
        machineSpec = {
          machineType      = var.vertex_machine_type
          acceleratorType  = local.vertex_accelerator_type
          acceleratorCount = local.vertex_accelerator_count
        }
        minReplicaCount = var.vertex_min_replicas
        maxReplicaCount = var.vertex_max_replicas
      }, local.vertex_autoscaling)
    }
    trafficSplit = { "0" = 100 }
  })
}

resource "google_vertex_ai_endpoint" "llm" {
  # checkov:skip=CKV2_GCP_33:a public (dedicated) endpoint still requires IAM-authenticated calls; a private one needs VPC peering this module does not create
  # checkov:skip=CKV2_GCP_24:predictions are not stored; Google-managed encryption is enough (add encryption_spec for CMEK)
  count                      = var.deploy_vertex ? 1 : 0
  name                       = local.vertex_endpoint_id
  display_name               = "vertex-gguf"
  location                   = var.region
  dedicated_endpoint_enabled = var.vertex_dedicated_endpoint
  depends_on                 = [google_project_service.apis]

  lifecycle {
    # The deploy script moves traffic; Terraform must never send its own (empty) split back.
    ignore_changes = [traffic_split]
  }
}

# Who may call the endpoint: roles/aiplatform.user (it holds aiplatform.endpoints.predict, which
# predict, rawPredict and streamRawPredict check) for each of var.vertex_invokers. On the project,
# not the endpoint: the endpoint-level IAM resources (google_vertex_ai_endpoint_iam_*) exist only
# in the google-beta provider, which this configuration does not use. The project role also lets
# those members use (and change) the project's other Vertex AI resources: grant it to callers you
# would trust with that, or bind endpoint IAM yourself with google-beta.
resource "google_project_iam_member" "vertex_invokers" {
  for_each = var.deploy_vertex ? toset(var.vertex_invokers) : toset([])
  project  = var.project_id
  role     = "roles/aiplatform.user"
  member   = each.value
}

resource "terraform_data" "vertex_deployment" {
  count = var.deploy_vertex ? 1 : 0

  triggers_replace = {
    project      = var.project_id
    region       = var.region
    endpoint_id  = google_vertex_ai_endpoint.llm[0].name
    image        = local.image_by_digest
    model_uri    = local.model_uri
    upload_body  = local.vertex_upload_body
    deploy_body  = local.vertex_deploy_body
    deploy_wait  = local.vertex_deploy_wait_s
    op_wait      = local.vertex_op_wait_s
    machine_type = var.vertex_machine_type
  }

  lifecycle {
    create_before_destroy = true
  }

  provisioner "local-exec" {
    command = "${path.module}/scripts/vertex_deploy.sh deploy"
    environment = {
      PROJECT           = self.triggers_replace.project
      REGION            = self.triggers_replace.region
      ENDPOINT_ID       = self.triggers_replace.endpoint_id
      DEPLOYED_MODEL_ID = tostring(parseint(substr(sha1("${self.id}/${jsonencode(self.triggers_replace)}"), 0, 8), 16))
      UPLOAD_BODY       = self.triggers_replace.upload_body
      DEPLOY_BODY       = self.triggers_replace.deploy_body
      DEPLOY_WAIT_S     = self.triggers_replace.deploy_wait
      OP_WAIT_S         = self.triggers_replace.op_wait
    }
  }

  provisioner "local-exec" {
    when    = destroy
    command = "${path.module}/scripts/vertex_deploy.sh undeploy"
    environment = {
      PROJECT           = self.triggers_replace.project
      REGION            = self.triggers_replace.region
      ENDPOINT_ID       = self.triggers_replace.endpoint_id
      DEPLOYED_MODEL_ID = tostring(parseint(substr(sha1("${self.id}/${jsonencode(self.triggers_replace)}"), 0, 8), 16))
      OP_WAIT_S         = self.triggers_replace.op_wait
    }
  }

  depends_on = [
    terraform_data.vertex_rules,
    google_storage_bucket_iam_member.runtime_reads_models,
    google_artifact_registry_repository_iam_member.runtime_pulls_images,
  ]
}
