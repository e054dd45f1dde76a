# Resumable streams: the values and plan-time checks that depend on variables only (no provider),
# so that tests/test_deploy_streams.py can run them through `terraform plan` offline. The
# Memorystore instance and the Cloud Run wiring are in streams.tf and cloud_run.tf.
#
# Which platform can reach which store (Google's "Choose an endpoint type" table for Vertex AI,
# https://cloud.google.com/vertex-ai/docs/predictions/choose-endpoint-type, row "Outbound
# networking"): a dedicated or shared public Vertex endpoint's containers reach the public
# internet only; a Private Service Connect endpoint has no outbound networking; only a private
# endpoint peered with a VPC (Endpoint.network, private services access) sends traffic into the
# VPC, and that endpoint type has a 60 s inference timeout, no streaming, no traffic split and one
# model per endpoint, which this configuration's streamed, zero-downtime deployments need. A
# Private Service Connect interface (pscInterfaceConfig) exists for custom training jobs,
# persistent resources, pipelines and reasoning engines, not for an endpoint's deployed models
# (aiplatform v1 and v1beta1 API, August 2026). Memorystore for Redis has internal addresses only
# and, in its default direct-peering mode, a peering that "other Google Cloud services do not
# share" (https://cloud.google.com/memorystore/docs/redis/networking): so a Vertex deployment
# cannot reach it, and vertex_stream_store takes a Redis reachable from the internet instead.

locals {
  # Cloud Run needs Direct VPC egress to reach a Redis on the VPC.
  cloud_run_vpc_egress = var.stream_store_redis || var.stream_store_url_on_vpc

  # The network the Memorystore instance is authorized on (its full name).
  stream_store_network_id = "projects/${var.project_id}/global/networks/${var.stream_store_network}"

  # STREAM_BUFFER_BYTES and STREAM_SESSION_TTL when set (both platforms, through server_env in
  # main.tf); unset, the server's defaults (4 MiB, 300 s). Empty by default, so adding the
  # variables changes no deployment.
  stream_tuning_env = merge(
    var.stream_buffer_bytes == null ? {} : { STREAM_BUFFER_BYTES = tostring(var.stream_buffer_bytes) },
    var.stream_session_ttl_seconds == null ? {} : { STREAM_SESSION_TTL = tostring(var.stream_session_ttl_seconds) },
  )

  # Whether stream_store_url is set: not a secret, though the URL is.
  stream_store_url_set = nonsensitive(var.stream_store_url != null)

  # A literal private (RFC 1918) or loopback address in vertex_stream_store: never reachable from
  # a Vertex deployment (see above).
  vertex_stream_store_host    = var.vertex_stream_store == null ? "" : try(regex("^rediss?://(?:[^@/]*@)?([^:/]+)", var.vertex_stream_store)[0], "")
  vertex_stream_store_private = can(regex("^(10\\.|192\\.168\\.|172\\.(1[6-9]|2[0-9]|3[01])\\.|127\\.|localhost$)", local.vertex_stream_store_host))
}

# Checks between variables, at plan time (validation blocks can name one variable only before
# Terraform 1.9). Nothing is created, and with every stream variable at its default not even this.
resource "terraform_data" "stream_rules" {
  count = var.stream_store_redis || local.stream_store_url_set || var.stream_store_url_on_vpc || var.vertex_stream_store != null ? 1 : 0

  input = {
    redis          = var.stream_store_redis
    url_on_vpc     = var.stream_store_url_on_vpc
    vertex_private = local.vertex_stream_store_private
  }

  lifecycle {
    precondition {
      condition     = !(var.stream_store_redis && local.stream_store_url_set)
      error_message = "Set stream_store_redis (create a Memorystore instance) or stream_store_url (use an existing Redis), not both."
    }
    precondition {
      condition     = !var.stream_store_url_on_vpc || local.stream_store_url_set
      error_message = "stream_store_url_on_vpc gives Cloud Run a way into the VPC for stream_store_url: set stream_store_url too."
    }
    precondition {
      condition     = !(var.stream_store_redis || local.stream_store_url_set) || var.deploy_cloud_run
      error_message = "stream_store_redis and stream_store_url configure the Cloud Run service only, and deploy_cloud_run is false: a Vertex AI deployment cannot reach a Memorystore instance (its endpoints have internet egress only); use vertex_stream_store for Vertex."
    }
    precondition {
      condition     = !local.vertex_stream_store_private
      error_message = "vertex_stream_store points at a private address (${local.vertex_stream_store_host}): a Vertex AI public or dedicated endpoint's containers reach the public internet only, so every session would fall back to the replica's memory. Use a Redis reachable from the internet (rediss:// with a password), or leave it null."
    }
  }
}

# A warning, not an error: a plain redis:// URL across the internet carries every resumable
# stream (the model's output) and the password in clear text.
check "vertex_stream_store_encrypted" {
  assert {
    condition     = var.vertex_stream_store == null || !startswith(coalesce(var.vertex_stream_store, "memory"), "redis://")
    error_message = "vertex_stream_store uses redis:// (no TLS) from Vertex AI across the internet: sessions and the password travel in clear text. Prefer rediss://."
  }
}
