variable "project_id" {
  description = "Google Cloud project to deploy into."
  type        = string
}

variable "region" {
  description = "Region for Artifact Registry, the model bucket, Vertex AI and Cloud Run (pick one with L4 GPUs, e.g. us-central1)."
  type        = string
  default     = "us-central1"
}

variable "repository" {
  description = "Artifact Registry repository for the image (cloudbuild.yaml's _REPOSITORY)."
  type        = string
  default     = "vertex-gguf"
}

variable "image_name" {
  description = "Image name in the repository (cloudbuild.yaml's _IMAGE)."
  type        = string
  default     = "vertex-gguf"
}

variable "image_tag" {
  description = "Image tag to deploy (cloudbuild.yaml's _TAG)."
  type        = string
  default     = "latest"
}

variable "model_bucket" {
  description = "Name of the bucket that holds models (created here; must be globally unique)."
  type        = string
}

variable "model_path" {
  description = "Directory (or .gguf object) in the bucket holding the model, e.g. qwen2.5-7b/ . Vertex gets it as the artifact URI (AIP_STORAGE_URI); Cloud Run as MODEL."
  type        = string
}

variable "model_file" {
  description = "MODEL_FILE: which GGUF to serve when the model directory holds several (a name or glob); empty when it holds one."
  type        = string
  default     = ""
}

variable "deploy_vertex" {
  description = "Create a Vertex AI endpoint and deploy the model to it."
  type        = bool
  default     = true
}

variable "deploy_cloud_run" {
  description = "Create a Cloud Run service with a GPU."
  type        = bool
  default     = true
}

variable "vertex_machine_type" {
  description = "Vertex AI machine type for the deployed model (g2-standard-* carry L4 GPUs)."
  type        = string
  default     = "g2-standard-8"
}

variable "vertex_accelerator_type" {
  description = "Vertex AI accelerator type."
  type        = string
  default     = "NVIDIA_L4"
}

variable "vertex_accelerator_count" {
  description = "GPUs per Vertex AI replica."
  type        = number
  default     = 1
}

variable "vertex_min_replicas" {
  description = "Minimum Vertex AI replicas."
  type        = number
  default     = 1
}

variable "vertex_max_replicas" {
  description = "Maximum Vertex AI replicas."
  type        = number
  default     = 1
}

variable "vertex_dedicated_endpoint" {
  description = "Use a dedicated endpoint: needed for streamRawPredict (streaming), 10 MB bodies and timeouts past 60 s."
  type        = bool
  default     = true
}

variable "deployment_timeout_seconds" {
  description = "How long Vertex waits for the container to become healthy (model download + load); Model Garden uses 7200."
  type        = number
  default     = 7200
}

variable "cloud_run_service_name" {
  description = "Cloud Run service name."
  type        = string
  default     = "vertex-gguf"
}

variable "cloud_run_cpu" {
  description = "vCPUs per Cloud Run instance (a GPU needs at least 4)."
  type        = string
  default     = "8"
}

variable "cloud_run_memory" {
  description = "Memory per Cloud Run instance (a GPU needs at least 16Gi; a downloaded model counts against it)."
  type        = string
  default     = "32Gi"
}

variable "cloud_run_concurrency" {
  description = "Requests one Cloud Run instance takes at once (the server queues past its slots)."
  type        = number
  default     = 16
}

variable "cloud_run_min_instances" {
  description = "Minimum Cloud Run instances (0 scales to zero)."
  type        = number
  default     = 0
}

variable "cloud_run_max_instances" {
  description = "Maximum Cloud Run instances (bounded by your L4 quota)."
  type        = number
  default     = 1
}

variable "request_timeout_seconds" {
  description = "Cloud Run request timeout (up to 3600 s, for long streams). The server's REQUEST_TIMEOUT is set 10 s below it so clients get a clean error event."
  type        = number
  default     = 3600
}

variable "startup_probe_failure_threshold" {
  description = "Startup probe attempts, 10 s apart, before Cloud Run gives up on an instance (model download + load)."
  type        = number
  default     = 180
}

variable "allow_unauthenticated" {
  description = "Let anyone invoke the Cloud Run service (otherwise list invokers in cloud_run_invokers)."
  type        = bool
  default     = false
}

variable "cloud_run_invokers" {
  description = "Members allowed to invoke the Cloud Run service, e.g. user:me@example.com."
  type        = list(string)
  default     = []
}
