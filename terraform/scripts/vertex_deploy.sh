#!/usr/bin/env bash
# Upload the model to the Vertex AI Model Registry and deploy it to the endpoint (or undeploy
# everything from the endpoint). Called by terraform_data in vertex.tf; the google provider has
# no resource for either step. Reads its inputs from the environment.
set -euo pipefail

action="${1:-deploy}"
: "${PROJECT:?}" "${REGION:?}" "${ENDPOINT_ID:?}"

deployed_ids() {
  gcloud ai endpoints describe "$ENDPOINT_ID" --project="$PROJECT" --region="$REGION" \
    --format='value(deployedModels[].id)' | tr ';' ' '
}

undeploy() {
  local id
  for id in "$@"; do
    gcloud ai endpoints undeploy-model "$ENDPOINT_ID" --project="$PROJECT" --region="$REGION" \
      --deployed-model-id="$id" --quiet
  done
}

case "$action" in
  deploy)
    : "${IMAGE:?}" "${ARTIFACT_URI:?}" "${DISPLAY_NAME:?}" "${PORT:?}" "${HEALTH_ROUTE:?}"
    : "${PREDICT_ROUTE:?}" "${MACHINE_TYPE:?}" "${ACCELERATOR:?}" "${SERVICE_ACCOUNT:?}"
    gcloud ai models upload --project="$PROJECT" --region="$REGION" \
      --display-name="$DISPLAY_NAME" \
      --container-image-uri="$IMAGE" \
      --artifact-uri="$ARTIFACT_URI" \
      --container-ports="$PORT" \
      --container-health-route="$HEALTH_ROUTE" \
      --container-predict-route="$PREDICT_ROUTE" \
      --container-env-vars="${ENV_VARS:-}" \
      --container-deployment-timeout-seconds="${DEPLOY_TIMEOUT_S:-7200}" \
      --container-startup-probe-exec="${STARTUP_PROBE_EXEC:-vertex-gguf,probe}" \
      --container-startup-probe-period-seconds=10 \
      --container-startup-probe-timeout-seconds=5
    model_id=$(gcloud ai models list --project="$PROJECT" --region="$REGION" \
      --filter="display_name=$DISPLAY_NAME" --sort-by=~create_time --limit=1 \
      --format='value(name.basename())')
    # the new deployment takes all traffic first; the old ones go after, so nothing is down
    read -r -a old <<< "$(deployed_ids)"
    gcloud ai endpoints deploy-model "$ENDPOINT_ID" --project="$PROJECT" --region="$REGION" \
      --model="$model_id" \
      --display-name="$DISPLAY_NAME" \
      --machine-type="$MACHINE_TYPE" \
      --accelerator="$ACCELERATOR" \
      --min-replica-count="${MIN_REPLICAS:-1}" \
      --max-replica-count="${MAX_REPLICAS:-1}" \
      --service-account="$SERVICE_ACCOUNT" \
      --traffic-split=0=100
    undeploy "${old[@]}"
    ;;
  undeploy)
    read -r -a old <<< "$(deployed_ids)"
    undeploy "${old[@]}"
    ;;
  *)
    echo "usage: $0 deploy|undeploy" >&2
    exit 2
    ;;
esac
