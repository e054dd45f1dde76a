#!/usr/bin/env bash
# One command from an empty Google Cloud project to a live deployment, and every redeploy after:
#
#   1. terraform init, then a first apply limited to the foundations: the APIs, the Artifact
#      Registry repository, the model bucket, the runtime and build service accounts with their
#      rights, and the bucket Cloud Build stages the source in. Nothing else creates them.
#   2. The model: --model PATH (a .gguf file, or a folder of them such as a split GGUF's shards)
#      is uploaded to gs://BUCKET/MODEL_PATH unless an object of that name is there already;
#      then the script stops unless a GGUF is there (the container would exit at start-up).
#   3. The image: Cloud Build (cloudbuild.yaml) as the build service account.
#   4. The full apply: Cloud Run and/or Vertex AI, running the image by digest.
#
# Usage: scripts/deploy.sh [--model PATH] [--bake] [--skip-build] [--yes] [-- TERRAFORM_APPLY_ARGS...]
#   --model PATH   upload this GGUF (or folder of GGUFs) first
#   --bake         bake the model into the image (cloud_run_model_baked=true; Cloud Run only)
#   --skip-build   redeploy the image already pushed under image_tag (a change of settings only)
#   --yes          apply without asking (terraform apply -auto-approve)
#   after --        passed to both applies, e.g. -- -var-file=prod.tfvars
# Environment: TF_DIR (default: terraform/ next to this script's folder).
# Needs gcloud (gcloud auth login, and gcloud auth application-default login for Terraform),
# terraform >= 1.5, and TF_DIR/terraform.tfvars (copy terraform.tfvars.example). bash 3.2 works.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TF_DIR="${TF_DIR:-$ROOT/terraform}"

# Everything the build needs before it runs, and nothing that deploys.
FOUNDATIONS="
google_project_service.apis
google_artifact_registry_repository.images
google_storage_bucket.models
google_service_account.runtime
google_storage_bucket_iam_member.runtime_reads_models
google_artifact_registry_repository_iam_member.runtime_pulls_images
google_service_account.build
google_artifact_registry_repository_iam_member.build_pushes_images
google_project_iam_member.build_writes_logs
google_storage_bucket.build_sources
google_storage_bucket_iam_member.build_reads_sources
google_storage_bucket_iam_member.build_reads_models
"

die() {
  echo "deploy: $*" >&2
  exit 1
}
step() { echo "==> $*"; }

model_src=""
bake=0
skip_build=0
approve=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model)
      [ $# -ge 2 ] || die "--model needs a path"
      model_src="$2"
      shift 2
      ;;
    --bake) bake=1; shift ;;
    --skip-build) skip_build=1; shift ;;
    --yes) approve="-auto-approve"; shift ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

command -v gcloud >/dev/null || die "gcloud is not installed"
command -v terraform >/dev/null || die "terraform is not installed"
[ -f "$TF_DIR/terraform.tfvars" ] || die "$TF_DIR/terraform.tfvars is missing: copy terraform.tfvars.example and fill it in"
if [ -n "$model_src" ] && [ ! -e "$model_src" ]; then die "no such model: $model_src"; fi

tf() { terraform -chdir="$TF_DIR" "$@"; }

# The same variables for both applies (bash 3.2: an empty array must not be expanded bare).
tf_vars=()
if [ "$bake" = 1 ]; then tf_vars=("-var=cloud_run_model_baked=true"); fi
tf_vars=(${tf_vars[@]+"${tf_vars[@]}"} ${extra[@]+"${extra[@]}"})

step "terraform init"
tf init -input=false

step "foundations: APIs, repository, buckets, service accounts"
targets=()
for address in $FOUNDATIONS; do targets=(${targets[@]+"${targets[@]}"} "-target=$address"); done
tf apply -input=false ${approve:+"$approve"} ${targets[@]+"${targets[@]}"} ${tf_vars[@]+"${tf_vars[@]}"}

project="$(tf output -raw build_project)"
build_sa="$(tf output -raw build_service_account)"
staging="$(tf output -raw build_source_staging_dir)"
substitutions="$(tf output -raw build_substitutions)"
model_uri="$(tf output -raw model_uri)"

if [ -n "$model_src" ]; then
  step "model: $model_src -> $model_uri"
  if [ -d "$model_src" ]; then
    set -- "$model_src"/*.gguf
    [ -e "$1" ] || die "no .gguf file in $model_src"
    gcloud storage cp --no-clobber "$@" "${model_uri%/}/"
  else
    case "$model_uri" in
      *.gguf) dest="$model_uri" ;;
      *) dest="${model_uri%/}/" ;;
    esac
    gcloud storage cp --no-clobber "$model_src" "$dest"
  fi
fi

# The container ends with an error when the model cannot be found: check before building.
listing="$(gcloud storage ls "$model_uri" 2>/dev/null || true)"
case "$listing" in
  *.gguf*) ;;
  *) die "no GGUF at $model_uri: pass --model PATH, or upload it (gcloud storage cp MODEL.gguf ${model_uri%/}/)" ;;
esac

if [ "$skip_build" = 1 ]; then
  step "build skipped: deploying what image_tag points at now"
else
  if [ "$bake" = 1 ]; then substitutions="$substitutions,_BAKE_MODEL=$model_uri"; fi
  step "build: Cloud Build as $build_sa"
  gcloud builds submit "$ROOT" \
    --project="$project" \
    --config="$ROOT/cloudbuild.yaml" \
    --service-account="projects/$project/serviceAccounts/$build_sa" \
    --gcs-source-staging-dir="$staging" \
    --substitutions="$substitutions"
fi

step "deploy: the full apply"
tf apply -input=false ${approve:+"$approve"} ${tf_vars[@]+"${tf_vars[@]}"}

tf output
