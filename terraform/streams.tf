# Resumable streams across Cloud Run instances: an optional Memorystore for Redis instance (only
# with stream_store_redis = true) that the Cloud Run service reaches through Direct VPC egress
# (cloud_run.tf), and the STREAM_STORE it gets. The variables and the plan-time checks are in
# variables.tf and streams_rules.tf; why Vertex AI cannot use this instance is there too.

resource "google_redis_instance" "streams" {
  # checkov:skip=CKV_GCP_95:AUTH off: the instance has only an internal address on the VPC (no public endpoint), and an AUTH string would sit in plain text in the Cloud Run env; what is stored is replayable stream output kept for minutes
  # checkov:skip=CKV_GCP_97:no in-transit TLS: the traffic stays on Google's VPC peering, and SERVER_AUTHENTICATION would need the instance's CA in the image; use stream_store_url with rediss:// for a TLS Redis
  count              = var.stream_store_redis ? 1 : 0
  name               = "vertex-gguf-streams"
  display_name       = "vertex-gguf resumable streams"
  region             = local.cloud_run_region
  tier               = var.stream_store_redis_tier
  memory_size_gb     = var.stream_store_redis_memory_size_gb
  redis_version      = var.stream_store_redis_version
  authorized_network = local.stream_store_network_id
  # The default mode: Memorystore peers its own network with stream_store_network; no private
  # services access range has to exist first.
  connect_mode = "DIRECT_PEERING"
  labels       = { app = "vertex-gguf", managed-by = "terraform" }
  # The sessions live for minutes (STREAM_SESSION_TTL): turning stream_store_redis off may delete
  # the instance (google provider 7.8 and later refuse to unless this is false).
  deletion_protection = false

  depends_on = [google_project_service.apis] # redis.googleapis.com
}

locals {
  # The Cloud Run service's STREAM_STORE: the instance above (database 0), an existing Redis, or
  # null (the server's default, memory).
  cloud_run_stream_store = (
    var.stream_store_redis
    ? "redis://${one(google_redis_instance.streams[*].host)}:${one(google_redis_instance.streams[*].port)}/0"
    : var.stream_store_url
  )
  cloud_run_stream_store_set = var.stream_store_redis || local.stream_store_url_set
}

output "stream_store_redis_host" {
  description = "The Memorystore instance's internal address (stream_store_redis), reachable from the VPC only; null without one."
  value       = one(google_redis_instance.streams[*].host)
}

output "stream_store_redis_port" {
  description = "The Memorystore instance's port; null without one."
  value       = one(google_redis_instance.streams[*].port)
}
