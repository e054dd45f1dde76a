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
  description = "Vertex AI machine type for the deployed model: g2-standard-* (L4: 1 GPU up to g2-standard-32, 2 on -24, 4 on -48, 8 on -96), a2-highgpu-1g/2g/4g/8g (A100 40 GB), a2-ultragpu-1g/2g/4g/8g (A100 80 GB), a3-highgpu-1g/2g/4g/8g (H100 80 GB), a3-megagpu-8g, a3-ultragpu-8g (H200). The GPU type and count follow from it (vertex_gpus in vertex_rules.tf)."
  type        = string
  default     = "g2-standard-8"
  validation {
    condition     = can(regex("^[a-z][a-z0-9]*-[a-z0-9-]+$", var.vertex_machine_type))
    error_message = "vertex_machine_type must be a Compute Engine machine type name such as g2-standard-8 or a3-highgpu-8g."
  }
}

variable "vertex_accelerator_type" {
  description = "Vertex AI accelerator type (NVIDIA_L4, NVIDIA_TESLA_A100, NVIDIA_A100_80GB, NVIDIA_H100_80GB, ...). null: the one vertex_machine_type carries; set it only for a machine type the table in vertex_rules.tf does not know (then set vertex_accelerator_count too)."
  type        = string
  default     = null
  validation {
    condition     = var.vertex_accelerator_type == null ? true : can(regex("^NVIDIA_[A-Z0-9_]+$", var.vertex_accelerator_type))
    error_message = "vertex_accelerator_type is a Vertex AI AcceleratorType enum name such as NVIDIA_L4 or NVIDIA_H100_80GB (or null to follow the machine type)."
  }
}

variable "vertex_accelerator_count" {
  description = "GPUs per Vertex AI replica. null: as many as vertex_machine_type carries (a plan fails when a set value disagrees with a known machine type). The server spreads the model over them (SPLIT_MODE / TENSOR_SPLIT)."
  type        = number
  default     = null
  validation {
    condition     = var.vertex_accelerator_count == null ? true : contains([1, 2, 4, 8, 16], var.vertex_accelerator_count)
    error_message = "vertex_accelerator_count must be 1, 2, 4, 8 or 16 (or null to follow the machine type)."
  }
}

variable "vertex_min_replicas" {
  description = "Minimum Vertex AI replicas (at least 1: a Vertex endpoint does not scale to zero)."
  type        = number
  default     = 1
  validation {
    condition     = var.vertex_min_replicas >= 1 && floor(var.vertex_min_replicas) == var.vertex_min_replicas
    error_message = "vertex_min_replicas must be a whole number >= 1."
  }
}

variable "vertex_max_replicas" {
  description = "Maximum Vertex AI replicas (>= vertex_min_replicas). A rollout runs the old and the new deployment side by side, so it needs up to twice this many machines' GPUs in quota."
  type        = number
  default     = 1
  validation {
    condition     = var.vertex_max_replicas >= 1 && floor(var.vertex_max_replicas) == var.vertex_max_replicas
    error_message = "vertex_max_replicas must be a whole number >= 1."
  }
}

variable "vertex_autoscaling_gpu_duty_cycle" {
  description = "Vertex AI autoscaling target: the average GPU duty cycle (percent, 1-100) across replicas above which Vertex adds replicas (up to vertex_max_replicas) and below which it removes them (down to vertex_min_replicas). null: Vertex AI's default target (60). Sent as deployModel's autoscalingMetricSpecs (aiplatform.googleapis.com/prediction/online/accelerator/duty_cycle); matters only when vertex_max_replicas > vertex_min_replicas. Changing it rolls out a new deployment."
  type        = number
  default     = null
  validation {
    condition     = var.vertex_autoscaling_gpu_duty_cycle == null ? true : (var.vertex_autoscaling_gpu_duty_cycle >= 1 && var.vertex_autoscaling_gpu_duty_cycle <= 100 && floor(var.vertex_autoscaling_gpu_duty_cycle) == var.vertex_autoscaling_gpu_duty_cycle)
    error_message = "vertex_autoscaling_gpu_duty_cycle must be null (Vertex AI's default) or a whole percentage from 1 to 100."
  }
}

variable "vertex_invokers" {
  description = "Members allowed to call the Vertex AI endpoint (predict, rawPredict, streamRawPredict), e.g. user:me@example.com, serviceAccount:app@p.iam.gserviceaccount.com, group:team@example.com. Granted roles/aiplatform.user on the project (see vertex.tf), which covers every Vertex AI resource in it, not this endpoint alone."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for m in var.vertex_invokers : can(regex("^(user|serviceAccount|group|domain|principal|principalSet):.+$", m))])
    error_message = "Each of vertex_invokers is an IAM member such as user:me@example.com, serviceAccount:NAME@PROJECT.iam.gserviceaccount.com, group:team@example.com or domain:example.com (allUsers / allAuthenticatedUsers cannot be granted a project role)."
  }
}

variable "vertex_dedicated_endpoint" {
  description = "Use a dedicated endpoint (its own DNS name): needed for streamRawPredict (streaming), 10 MB bodies and requests past 60 s. A dedicated endpoint refuses calls on the shared {region}-aiplatform.googleapis.com host: use the vertex_* URL outputs."
  type        = bool
  default     = true
}

variable "vertex_invoke_routes" {
  description = "Deploy with Vertex AI's invoke method (the Model's invokeRoutePrefix \"/*\", a preview feature, dedicated endpoints only) instead of the predict route: every container path is reachable as POST https://DEDICATED_DNS/v1/projects/P/locations/R/endpoints/E/invoke/PATH (output vertex_invoke_url), e.g. .../invoke/v1/chat/completions, and :predict, :rawPredict and :streamRawPredict are off (their outputs are null). Changing it rolls out a new deployment."
  type        = bool
  default     = false
}

variable "vertex_endpoint_id" {
  description = "Vertex AI endpoint id. Empty: a number derived from project, region and vertex_dedicated_endpoint, so a replaced endpoint (create before destroy) never collides with the old one and two stacks in different regions never share one."
  type        = string
  default     = ""
  validation {
    condition     = var.vertex_endpoint_id == "" || can(regex("^([1-9][0-9]{0,9}|[a-z][a-z0-9-]{0,62})$", var.vertex_endpoint_id))
    error_message = "vertex_endpoint_id must be empty, a number of at most 10 digits without a leading zero, or lowercase letters, digits and hyphens starting with a letter (at most 63)."
  }
}

variable "deployment_timeout_seconds" {
  description = "How long Vertex AI waits for a new deployment to become healthy (model download + load); the API allows at most 7200 (2 h), which Model Garden uses."
  type        = number
  default     = 7200
  validation {
    condition     = var.deployment_timeout_seconds >= 60 && var.deployment_timeout_seconds <= 7200
    error_message = "deployment_timeout_seconds must be between 60 and 7200 (the Vertex AI limit: 2 hours)."
  }
}

variable "vertex_startup_probe" {
  description = "Vertex AI startup probe: an HTTP GET of the health route (503 until the model is loaded, then 200) every period_seconds, each given timeout_seconds; the container is restarted after failure_threshold failures. The API's Probe message says period_seconds must be less than timeout_seconds and timeout_seconds greater than or equal to period_seconds: timeout_seconds > period_seconds satisfies both. Its budget, period_seconds x failure_threshold (default 7200 s), is the time a replica has to download and load the model, and must not exceed deployment_timeout_seconds."
  type = object({
    period_seconds    = number
    timeout_seconds   = number
    failure_threshold = number
  })
  default = {
    period_seconds    = 10
    timeout_seconds   = 15
    failure_threshold = 720
  }
  validation {
    condition     = var.vertex_startup_probe.period_seconds >= 1 && var.vertex_startup_probe.failure_threshold >= 1
    error_message = "vertex_startup_probe.period_seconds and failure_threshold must be >= 1."
  }
  validation {
    condition     = var.vertex_startup_probe.timeout_seconds > var.vertex_startup_probe.period_seconds
    error_message = "vertex_startup_probe.timeout_seconds must be greater than period_seconds (the Vertex AI Probe message: period_seconds must be less than timeout_seconds)."
  }
  validation {
    condition     = var.vertex_startup_probe.period_seconds * var.vertex_startup_probe.failure_threshold >= 300
    error_message = "vertex_startup_probe gives a replica period_seconds x failure_threshold seconds to download and load the model; under 300 s a multi-GB GGUF never starts (the default is 10 x 720 = 7200 s)."
  }
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
  description = "Cloud Run request timeout (up to 3600 s, for long streams). The server's REQUEST_TIMEOUT is set 10 s below it so clients get a clean error event. Vertex AI has its own, fixed limit (see vertex_rules.tf)."
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

# ---- Resumable streams (X-Conversation-Id; the server's STREAM_STORE) ---------------------------
# Where a resumable stream's bytes live, so that a resume (GET /v1/stream) can land on another
# replica than the one generating. streams.tf and streams_rules.tf use these; docs/streaming.md,
# "Resumable streams across replicas (Redis)", says when each is needed.

variable "stream_store_redis" {
  description = "Create a Memorystore for Redis instance (streams.tf) in the Cloud Run region, on stream_store_network, and point the Cloud Run service's STREAM_STORE at it (redis://HOST:PORT/0, through Direct VPC egress). Vertex AI cannot reach it: a public or dedicated Vertex endpoint has internet egress only (see vertex_stream_store). false: nothing is created and each replica keeps its streams in memory."
  type        = bool
  default     = false
}

variable "stream_store_redis_tier" {
  description = "Memorystore tier: BASIC (one node; a failure or maintenance loses the sessions, and the server falls back to in-process sessions meanwhile) or STANDARD_HA (a replica in another zone with automatic failover)."
  type        = string
  default     = "BASIC"
  validation {
    condition     = contains(["BASIC", "STANDARD_HA"], var.stream_store_redis_tier)
    error_message = "stream_store_redis_tier must be BASIC or STANDARD_HA."
  }
}

variable "stream_store_redis_memory_size_gb" {
  description = "Memorystore capacity in GiB (1-300, Memorystore's range). A live session holds at most STREAM_BUFFER_BYTES (4 MiB by default) and a finished one is kept STREAM_SESSION_TTL seconds, so 1 GiB holds about 250 full-size sessions at once."
  type        = number
  default     = 1
  validation {
    condition     = var.stream_store_redis_memory_size_gb >= 1 && var.stream_store_redis_memory_size_gb <= 300 && floor(var.stream_store_redis_memory_size_gb) == var.stream_store_redis_memory_size_gb
    error_message = "stream_store_redis_memory_size_gb must be a whole number of GiB from 1 to 300."
  }
}

variable "stream_store_redis_version" {
  description = "Memorystore Redis version (the API's redisVersion: REDIS_6_X, REDIS_7_0, REDIS_7_2, ...)."
  type        = string
  default     = "REDIS_7_2"
  validation {
    condition     = can(regex("^REDIS_[0-9]+_[0-9X]+$", var.stream_store_redis_version))
    error_message = "stream_store_redis_version is a Memorystore redisVersion such as REDIS_7_2 or REDIS_6_X."
  }
}

variable "stream_store_network" {
  description = "Name of the VPC network, in project_id, that the Memorystore instance is reachable on and Cloud Run's Direct VPC egress joins (default: the project's auto-mode `default` network). Used only with stream_store_redis or stream_store_url_on_vpc. A Shared VPC network of another project is not supported here: Memorystore needs its private-services-access mode and grants on the host project for that."
  type        = string
  default     = "default"
  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.stream_store_network))
    error_message = "stream_store_network is the name of a VPC network in project_id (lowercase letters, digits and hyphens)."
  }
}

variable "stream_store_subnetwork" {
  description = "Name of the subnetwork of stream_store_network, in the Cloud Run region, that Cloud Run's Direct VPC egress takes instance addresses from (about two per instance). Default: `default`, the auto-mode network's subnet in every region."
  type        = string
  default     = "default"
  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.stream_store_subnetwork))
    error_message = "stream_store_subnetwork is the name of a subnetwork of stream_store_network (lowercase letters, digits and hyphens)."
  }
}

variable "stream_store_url" {
  description = "An existing Redis for the Cloud Run service's STREAM_STORE instead of creating one: redis://[:PASSWORD@]HOST:PORT/DB or rediss://... null: none (memory, or the instance stream_store_redis creates). A host on the VPC (an existing Memorystore instance) also needs stream_store_url_on_vpc = true. Sensitive: hidden in plans, but it is stored in the state and in the service's env (visible to whoever can view the service)."
  type        = string
  default     = null
  sensitive   = true
  validation {
    condition     = var.stream_store_url == null ? true : can(regex("^rediss?://[^[:space:]]+$", var.stream_store_url))
    error_message = "stream_store_url must be null or a redis:// or rediss:// URL."
  }
}

variable "stream_store_url_on_vpc" {
  description = "stream_store_url's host is an internal address on stream_store_network (an existing Memorystore instance, a Redis VM): give Cloud Run Direct VPC egress to it, as stream_store_redis does."
  type        = bool
  default     = false
}

variable "vertex_stream_store" {
  description = "STREAM_STORE for the Vertex AI deployment: null (the server's default, memory: each replica keeps its own sessions, complete while vertex_max_replicas is 1) or a Redis URL reachable from the public internet (rediss:// with a password, e.g. a managed Redis with TLS). A public or dedicated Vertex endpoint's containers have internet egress only, so Memorystore (private addresses only) is out of their reach. The URL is part of the Model's container spec (visible to whoever can read the Model) and of the plan and the state: it is not marked sensitive, as that would hide the deploy script's log."
  type        = string
  default     = null
  validation {
    condition     = var.vertex_stream_store == null ? true : can(regex("^(memory|rediss?://[^[:space:]]+)$", var.vertex_stream_store))
    error_message = "vertex_stream_store must be null, memory, or a redis:// or rediss:// URL."
  }
}

variable "stream_buffer_bytes" {
  description = "STREAM_BUFFER_BYTES on both platforms: the newest bytes of a resumable stream kept for a resume (256 to 268435456). null: the server's default, 4 MiB."
  type        = number
  default     = null
  validation {
    condition     = var.stream_buffer_bytes == null ? true : (var.stream_buffer_bytes >= 256 && var.stream_buffer_bytes <= 268435456 && floor(var.stream_buffer_bytes) == var.stream_buffer_bytes)
    error_message = "stream_buffer_bytes must be null or a whole number of bytes from 256 to 268435456 (256 MiB), the server's bounds."
  }
}

variable "stream_session_ttl_seconds" {
  description = "STREAM_SESSION_TTL on both platforms: seconds a finished resumable stream can still be replayed (1 to 604800). null: the server's default, 300."
  type        = number
  default     = null
  validation {
    condition     = var.stream_session_ttl_seconds == null ? true : (var.stream_session_ttl_seconds >= 1 && var.stream_session_ttl_seconds <= 604800 && floor(var.stream_session_ttl_seconds) == var.stream_session_ttl_seconds)
    error_message = "stream_session_ttl_seconds must be null or a whole number of seconds from 1 to 604800 (7 days), the server's bounds."
  }
}

variable "cloud_run_session_affinity" {
  description = "Cloud Run session affinity: a client that sends back Cloud Run's affinity cookie reaches the same instance again, so a resume usually finds its stream in memory. Best effort: an instance that restarts, scales in or is at its concurrency or CPU limit breaks it (use Redis for a guarantee)."
  type        = bool
  default     = false
}
