output "image" {
  description = "The image reference both platforms run (build and push it with cloudbuild.yaml)."
  value       = local.image
}

output "model_uri" {
  description = "Where the model is read from."
  value       = local.model_uri
}

output "vertex_endpoint_id" {
  description = "Vertex AI endpoint id (for gcloud ai endpoints predict / rawPredict / streamRawPredict)."
  value       = var.deploy_vertex ? google_vertex_ai_endpoint.llm[0].name : null
}

output "cloud_run_url" {
  description = "Cloud Run service URL (the OpenAI base URL is this + /v1)."
  value       = var.deploy_cloud_run ? google_cloud_run_v2_service.llm[0].uri : null
}

output "runtime_service_account" {
  description = "Service account the container runs as."
  value       = google_service_account.runtime.email
}
