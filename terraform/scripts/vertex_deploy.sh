#!/usr/bin/env bash
# Deploy one model version to a Vertex AI endpoint, or take exactly that one away again.
# Called by terraform_data.vertex_deployment (terraform/vertex.tf); reads its inputs from the env.
#
#   deploy    upload the Model (models.upload: the container spec with its HTTP startup probe,
#             which gcloud cannot set a failure threshold for), then endpoints.deployModel with
#             the given deployed-model id and trafficSplit {"0": 100}: Vertex moves all traffic to
#             the new deployment once it is healthy. Nothing else on the endpoint is touched; the
#             old deployment is undeployed by its own Terraform instance's destroy, afterwards.
#   undeploy  undeploy DEPLOYED_MODEL_ID (only that one) and delete its Model from the registry.
#
# Both are idempotent (a step already done is skipped) and every wait is bounded. Needs bash
# 3.2+ (macOS), curl and an authenticated gcloud (for the access token) on the Terraform host.
# No arrays: bash < 4.4 treats "${a[@]}" of an empty array as unbound under set -u. No `cmd | grep -q`
# either: under pipefail, grep -q leaving early can fail the writer with SIGPIPE (here-strings instead).
set -euo pipefail

action="${1:-deploy}"
: "${PROJECT:?}" "${REGION:?}" "${ENDPOINT_ID:?}" "${DEPLOYED_MODEL_ID:?}"
OP_WAIT_S="${OP_WAIT_S:-1800}"
DEPLOY_WAIT_S="${DEPLOY_WAIT_S:-9000}"
POLL_S="${POLL_S:-15}"
API="${VERTEX_API:-https://${REGION}-aiplatform.googleapis.com}/v1"
PARENT="projects/${PROJECT}/locations/${REGION}"
MODEL_ID="vertex-gguf-${DEPLOYED_MODEL_ID}"
ENDPOINT="${PARENT}/endpoints/${ENDPOINT_ID}"
MODEL="${PARENT}/models/${MODEL_ID}"

case "$DEPLOYED_MODEL_ID" in
  '' | *[!0-9]*) echo "DEPLOYED_MODEL_ID must be a number, got '$DEPLOYED_MODEL_ID'" >&2; exit 2 ;;
esac

tmp="$(mktemp -d "${TMPDIR:-/tmp}/vertex_deploy.XXXXXX")"
status=""
body=""

log() { echo "vertex_deploy: $*" >&2; }

# api METHOD PATH [JSON]: sets $status (the HTTP code) and $body; fails on a transport error only.
api() {
  local method="$1" path="$2" data="${3:-}" token
  token="$(gcloud auth print-access-token)"
  if [ -n "$data" ]; then
    printf '%s' "$data" > "$tmp/request.json"
    status="$(curl -sS -o "$tmp/response.json" -w '%{http_code}' -X "$method" \
      -H "Authorization: Bearer ${token}" -H 'Content-Type: application/json' \
      --data-binary "@$tmp/request.json" "${API}/${path}")"
  else
    status="$(curl -sS -o "$tmp/response.json" -w '%{http_code}' -X "$method" \
      -H "Authorization: Bearer ${token}" "${API}/${path}")"
  fi
  body="$(cat "$tmp/response.json" 2>/dev/null || true)"
}

# api_ok METHOD PATH [JSON]: api, failing with the response on anything but 2xx.
api_ok() {
  api "$@"
  case "$status" in
    2??) ;;
    *) log "$1 $2 answered HTTP $status: $body"; return 1 ;;
  esac
}

# wait_op SECONDS: wait for the long-running operation named in $body, at most SECONDS.
wait_op() {
  local limit="$1" name waited=0
  name="$(grep -o '"name":[[:space:]]*"[^"]*/operations/[^"]*"' <<< "$body" |
    sed -n '1s/.*"\([^"]*\)"$/\1/p' || true)"
  if [ -z "$name" ]; then
    log "no operation in the answer: $body"
    return 1
  fi
  while :; do
    if grep -q '"done":[[:space:]]*true' <<< "$body"; then
      if grep -q '"error":' <<< "$body"; then
        log "operation $name failed: $body"
        return 1
      fi
      return 0
    fi
    if [ "$waited" -ge "$limit" ]; then
      log "operation $name still running after ${limit} s; it goes on in Vertex AI: check it with"
      log "  gcloud ai operations describe ${name##*/} --region=${REGION} --project=${PROJECT}"
      return 1
    fi
    sleep "$POLL_S"
    waited=$((waited + POLL_S))
    [ "$POLL_S" -gt 0 ] || waited=$((waited + 1))
    api_ok GET "$name" || return 1
  done
}

model_exists() {
  api GET "$MODEL"
  case "$status" in
    200) return 0 ;;
    404) return 1 ;;
    *) log "GET $MODEL answered HTTP $status: $body"; exit 1 ;;
  esac
}

deployed() {
  api_ok GET "$ENDPOINT" || exit 1
  grep -q "\"id\":[[:space:]]*\"${DEPLOYED_MODEL_ID}\"" <<< "$body"
}

delete_model() {
  if model_exists; then
    log "deleting Model ${MODEL_ID} from the registry"
    api_ok DELETE "$MODEL" || return 1
    wait_op "$OP_WAIT_S" || return 1
  fi
}

uploaded=0
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$uploaded" = 1 ] && ! deployed; then
    log "deployment failed: removing the Model this run uploaded"
    delete_model || log "could not delete Model ${MODEL_ID}: delete it by hand"
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap on_exit EXIT

case "$action" in
  deploy)
    : "${UPLOAD_BODY:?}" "${DEPLOY_BODY:?}"
    if model_exists; then
      log "Model ${MODEL_ID} already uploaded"
    else
      log "uploading Model ${MODEL_ID}"
      uploaded=1
      api_ok POST "${PARENT}/models:upload" "$(printf '%s' "$UPLOAD_BODY" | sed "s/__MODEL_ID__/${MODEL_ID}/g")"
      wait_op "$OP_WAIT_S"
    fi
    if deployed; then
      log "deployed model ${DEPLOYED_MODEL_ID} already on endpoint ${ENDPOINT_ID}: nothing to deploy"
    else
      log "deploying ${MODEL_ID} as deployed model ${DEPLOYED_MODEL_ID} on endpoint ${ENDPOINT_ID} (up to ${DEPLOY_WAIT_S} s)"
      api_ok POST "${ENDPOINT}:deployModel" "$(printf '%s' "$DEPLOY_BODY" |
        sed -e "s/__DEPLOYED_MODEL_ID__/${DEPLOYED_MODEL_ID}/g" -e "s/__MODEL_ID__/${MODEL_ID}/g")"
      wait_op "$DEPLOY_WAIT_S"
    fi
    uploaded=0
    log "done: deployed model ${DEPLOYED_MODEL_ID} (Model ${MODEL_ID}) on endpoint ${ENDPOINT_ID}"
    ;;
  undeploy)
    if deployed; then
      log "undeploying deployed model ${DEPLOYED_MODEL_ID} from endpoint ${ENDPOINT_ID}"
      api_ok POST "${ENDPOINT}:undeployModel" "{\"deployedModelId\": \"${DEPLOYED_MODEL_ID}\"}"
      wait_op "$OP_WAIT_S"
    else
      log "deployed model ${DEPLOYED_MODEL_ID} is not on endpoint ${ENDPOINT_ID}"
    fi
    delete_model
    ;;
  *)
    echo "usage: $0 deploy|undeploy" >&2
    exit 2
    ;;
esac
