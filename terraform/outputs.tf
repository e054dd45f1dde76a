output "image" {
  description = "The image reference both platforms run (build and push it with cloudbuild.yaml)."
  value       = local.image
}

output "model_uri" {
  description = "Where the model is read from."
  value       = local.model_uri
}

locals {
  # A dedicated endpoint answers on its own DNS name only; a shared one on the regional host.
  vertex_host = !var.deploy_vertex ? null : (
    var.vertex_dedicated_endpoint
    ? trimprefix(google_vertex_ai_endpoint.llm[0].dedicated_endpoint_dns, "https://")
    : "${var.region}-aiplatform.googleapis.com"
  )
  vertex_endpoint_path = "projects/${var.project_id}/locations/${var.region}/endpoints/${local.vertex_endpoint_id}"
}

output "vertex_endpoint_id" {
  description = "Vertex AI endpoint id."
  value       = var.deploy_vertex ? google_vertex_ai_endpoint.llm[0].name : null
}

output "vertex_endpoint_dns" {
  description = "The dedicated endpoint's own DNS name ({endpoint}.{region}-{number}.prediction.vertexai.goog): every call goes here, never to the shared {region}-aiplatform.googleapis.com host, which a dedicated endpoint refuses."
  value       = var.deploy_vertex && var.vertex_dedicated_endpoint ? local.vertex_host : null
}

output "vertex_predict_url" {
  description = "POST a predict envelope ({\"instances\": [...], \"parameters\": {...}}) here with a Google access token."
  value       = var.deploy_vertex && !var.vertex_invoke_routes ? "https://${local.vertex_host}/v1/${local.vertex_endpoint_path}:predict" : null
}

output "vertex_raw_predict_url" {
  description = "POST an OpenAI, Anthropic Messages or Responses body here; the answer comes back as is."
  value       = var.deploy_vertex && !var.vertex_invoke_routes ? "https://${local.vertex_host}/v1/${local.vertex_endpoint_path}:rawPredict" : null
}

output "vertex_stream_raw_predict_url" {
  description = "As vertex_raw_predict_url, for streamed answers (\"stream\": true): server-sent events."
  value       = var.deploy_vertex && !var.vertex_invoke_routes ? "https://${local.vertex_host}/v1/${local.vertex_endpoint_path}:streamRawPredict" : null
}

output "vertex_invoke_url" {
  description = "With vertex_invoke_routes: POST here + a container path (e.g. /v1/chat/completions, /predict), with a Google access token; Vertex forwards it to that path. Google documents the invoke method as POST only. null otherwise."
  value       = var.deploy_vertex && var.vertex_invoke_routes ? "https://${local.vertex_host}/v1/${local.vertex_endpoint_path}/invoke" : null
}

output "vertex_openai_base_url" {
  description = "base_url for openai.OpenAI(base_url=..., api_key=<access token>): Vertex AI's OpenAI-compatible chat completions method (v1beta1 .../endpoints/ID/chat/completions) on the endpoint's own host."
  value       = var.deploy_vertex && !var.vertex_invoke_routes ? "https://${local.vertex_host}/v1beta1/${local.vertex_endpoint_path}" : null
}

output "vertex_deployed_model_id" {
  description = "The deployed model now serving on the endpoint (its Model in the registry is vertex-gguf-<this id>)."
  value       = var.deploy_vertex ? tostring(parseint(substr(sha1("${terraform_data.vertex_deployment[0].id}/${jsonencode(terraform_data.vertex_deployment[0].triggers_replace)}"), 0, 8), 16)) : null
}

output "cloud_run_url" {
  description = "Cloud Run service URL (the OpenAI base URL is this + /v1)."
  value       = var.deploy_cloud_run ? google_cloud_run_v2_service.llm[0].uri : null
}

output "runtime_service_account" {
  description = "Service account the container runs as."
  value       = google_service_account.runtime.email
}
