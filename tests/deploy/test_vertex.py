"""The Vertex AI deploy, checked offline: terraform/vertex*.tf, variables, outputs and the deploy script.

Terraform is parsed with python-hcl2 and asserted; the variable validations and cross-variable
preconditions (terraform/vertex_rules.tf, which needs no provider) are run through a real
`terraform plan` when terraform is installed; terraform/scripts/vertex_deploy.sh runs against a fake
`gcloud` (the access token) and a fake `curl` (a small in-memory Vertex AI REST API) that record
every call: first deploy, redeploy (new beside old, then the old one's destroy), destroy, a failed
deploy and a bounded wait.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.deploy_files import TF, terraform, tf_blocks, tf_file, tf_locals, unq

SCRIPT = TF / "scripts" / "vertex_deploy.sh"
load = tf_file


def resources(name: str) -> dict[tuple[str, str], dict]:
    return tf_blocks("resource", [name])


def local_values(name: str) -> dict:
    return tf_locals([name], unquote=False)


def variables() -> dict[str, dict]:
    return tf_blocks("variable", ["variables.tf"])


def outputs() -> dict[str, dict]:
    return tf_blocks("output", ["outputs.tf"])


# ---- Terraform: rollout, endpoint, env, probe, outputs ----------------------------------------


def test_rollout_creates_before_destroying_and_destroy_is_scoped():
    deploy = resources("vertex.tf")[("terraform_data", "vertex_deployment")]
    assert deploy["lifecycle"][0]["create_before_destroy"] is True
    create, destroy = (p['"local-exec"'] for p in deploy["provisioner"])
    assert "when" not in create and unq(destroy["when"]) in {"destroy", "${destroy}"}
    assert unq(create["command"]).endswith("vertex_deploy.sh deploy")
    assert unq(destroy["command"]).endswith("vertex_deploy.sh undeploy")
    # the deployed-model id: one expression, the same at create and at destroy, from the inputs
    # and the instance's own id (so a forced -replace with the same inputs gets a new one)
    id_expr = create["environment"]["DEPLOYED_MODEL_ID"]
    assert id_expr == destroy["environment"]["DEPLOYED_MODEL_ID"]
    assert "self.id" in id_expr and "jsonencode(self.triggers_replace)" in id_expr
    out_expr = outputs()["vertex_deployed_model_id"]["value"]
    assert id_expr.replace("self.", "terraform_data.vertex_deployment[0].").strip("${}") in out_expr
    # destroy reads only what the instance stored
    for key, value in destroy["environment"].items():
        assert "self." in value and not re.search(r"\b(var|local|google_\w+|terraform_data)\.", value), (key, value)
    triggers = deploy["triggers_replace"]
    assert triggers["upload_body"] == "${local.vertex_upload_body}"
    assert triggers["deploy_body"] == "${local.vertex_deploy_body}"
    assert triggers["endpoint_id"] == "${google_vertex_ai_endpoint.llm[0].name}"
    assert triggers["image"] == "${local.image_by_digest}"  # a rebuild (new digest) rolls out; a re-apply does not
    assert "${terraform_data.vertex_rules}" in deploy["depends_on"]


def test_endpoint_id_and_traffic_split_drift():
    endpoint = resources("vertex.tf")[("google_vertex_ai_endpoint", "llm")]
    assert endpoint["name"] == "${local.vertex_endpoint_id}"
    assert endpoint["lifecycle"][0]["ignore_changes"] == ["traffic_split"]
    assert endpoint["dedicated_endpoint_enabled"] == "${var.vertex_dedicated_endpoint}"
    expr = local_values("vertex_rules.tf")["vertex_endpoint_id"]
    for part in ("var.vertex_endpoint_id", "var.project_id", "var.region", "var.vertex_dedicated_endpoint"):
        assert part in expr


def test_upload_body_probe_env_and_model():
    loc = local_values("vertex.tf")
    upload = loc["vertex_upload_body"]
    assert 'modelId = "__MODEL_ID__"' in upload
    assert "startupProbe = {httpGet = {path = local.health_route, port = local.port}" in upload
    for field in ("periodSeconds = var.vertex_startup_probe.period_seconds",
                  "timeoutSeconds = var.vertex_startup_probe.timeout_seconds",
                  "failureThreshold = var.vertex_startup_probe.failure_threshold",
                  'deploymentTimeout = "${var.deployment_timeout_seconds}s"',
                  "imageUri = local.image_by_digest", "healthRoute = local.health_route",
                  "predictRoute = local.predict_route", "env = [for k, v in local.vertex_env"):
        assert field in upload, field
    assert "artifactUri" not in upload  # R5: the model comes from MODEL=gs://..., as on Cloud Run
    env = loc["vertex_env"]
    assert env.startswith("${merge(local.server_env,")
    assert "MODEL = local.model_uri" in env
    assert "REQUEST_TIMEOUT = tostring(local.vertex_request_timeout_s)" in env
    rules = local_values("vertex_rules.tf")
    assert rules["vertex_inference_timeout_s"] == 600
    assert rules["vertex_request_timeout_s"] == "${local.vertex_inference_timeout_s - 10}"


def test_deploy_body_moves_traffic_and_carries_the_gpus():
    body = local_values("vertex.tf")["vertex_deploy_body"]
    assert 'id = "__DEPLOYED_MODEL_ID__"' in body
    assert 'trafficSplit = {"0" = 100}' in body
    for field in ("machineType = var.vertex_machine_type", "acceleratorType = local.vertex_accelerator_type",
                  "acceleratorCount = local.vertex_accelerator_count",
                  "minReplicaCount = var.vertex_min_replicas", "maxReplicaCount = var.vertex_max_replicas",
                  "serviceAccount = google_service_account.runtime.email",
                  'model = "projects/${var.project_id}/locations/${var.region}/models/__MODEL_ID__"'):
        assert field in body, field


def test_callers_get_aiplatform_user_on_the_project():
    """Review section 4, item 5: vertex_invokers may call the endpoint; project-level, as endpoint IAM is beta-only."""
    grant = resources("vertex.tf")[("google_project_iam_member", "vertex_invokers")]
    assert unq(grant["role"]) == "roles/aiplatform.user"
    assert grant["project"] == "${var.project_id}"
    assert grant["member"] == "${each.value}"
    assert "var.vertex_invokers" in grant["for_each"] and "var.deploy_vertex" in grant["for_each"]
    var = variables()["vertex_invokers"]
    assert var["default"] == [] and "list(string)" in var["type"]
    text = (TF / "vertex.tf").read_text()
    assert "google-beta" in text[:text.index('resource "google_project_iam_member" "vertex_invokers"')]
    # no endpoint-level IAM (beta provider only) and no other grant of the role
    assert not any(rtype.startswith("google_vertex_ai_endpoint_iam") for rtype, _ in resources("vertex.tf"))


def test_autoscaling_target_only_when_set():
    """Review section 4, item 12: the GPU duty cycle target reaches deployModel's dedicatedResources."""
    loc = local_values("vertex.tf")
    assert "aiplatform.googleapis.com/prediction/online/accelerator/duty_cycle" in loc["vertex_autoscaling"]
    assert "if var.vertex_autoscaling_gpu_duty_cycle != null" in loc["vertex_autoscaling"]
    assert "local.vertex_autoscaling" in loc["vertex_deploy_body"]
    var = variables()["vertex_autoscaling_gpu_duty_cycle"]
    assert var["default"] is None and "number" in var["type"]


def test_probe_defaults_within_the_api_rules():
    var = variables()
    probe = var["vertex_startup_probe"]["default"]
    assert probe["timeout_seconds"] > probe["period_seconds"]  # Probe: period < timeout
    budget = probe["period_seconds"] * probe["failure_threshold"]
    timeout = var["deployment_timeout_seconds"]["default"]
    assert 3600 <= budget <= timeout <= 7200  # long enough for a multi-GB download; the API's 2 h cap
    assert len(var["vertex_startup_probe"]["validation"]) >= 3
    assert var["deployment_timeout_seconds"]["validation"]


def test_machine_table_is_consistent():
    gpus = local_values("vertex_rules.tf")["vertex_gpus"]
    table = {unq(k): v for k, v in gpus.items()}
    for name, spec in table.items():
        kind = unq(spec["type"])
        if name.startswith(("a2-", "a3-")):  # the machine name says how many GPUs
            assert name.endswith(f"-{spec['count']}g"), name
        assert kind.startswith("NVIDIA_")
    assert table["a3-highgpu-8g"] == {"type": '"NVIDIA_H100_80GB"', "count": 8} or unq(
        table["a3-highgpu-8g"]["type"]) == "NVIDIA_H100_80GB"
    assert table["g2-standard-8"]["count"] == 1 and table["g2-standard-48"]["count"] == 4
    for name in ("a2-highgpu-2g", "a2-highgpu-4g", "a2-highgpu-8g", "a2-ultragpu-8g", "a3-highgpu-8g"):
        assert name in table


def test_outputs_use_the_endpoints_own_dns():
    out = outputs()
    loc = local_values("outputs.tf")
    assert "google_vertex_ai_endpoint.llm[0].dedicated_endpoint_dns" in loc["vertex_host"]
    assert 'trimprefix(' in loc["vertex_host"]
    assert out["vertex_endpoint_dns"]["value"] == (
        "${var.deploy_vertex && var.vertex_dedicated_endpoint ? local.vertex_host : null}")
    path = "https://${local.vertex_host}/v1/${local.vertex_endpoint_path}"
    assert f"{path}:predict" in out["vertex_predict_url"]["value"]
    assert f"{path}:rawPredict" in out["vertex_raw_predict_url"]["value"]
    assert f"{path}:streamRawPredict" in out["vertex_stream_raw_predict_url"]["value"]
    assert "https://${local.vertex_host}/v1beta1/${local.vertex_endpoint_path}" in out["vertex_openai_base_url"]["value"]
    assert unq(loc["vertex_endpoint_path"]) == (
        "projects/${var.project_id}/locations/${var.region}/endpoints/${local.vertex_endpoint_id}")
    for name, body in out.items():
        assert unq(body.get("description", "")), name
    # the shared regional host only when the endpoint is not dedicated
    assert re.search(r'var\.vertex_dedicated_endpoint \? trimprefix\(.*\) : "\$\{var\.region\}-aiplatform', loc["vertex_host"])
    for name, body in out.items():
        assert "aiplatform.googleapis.com" not in body["value"], name


# ---- Terraform run offline: validations, preconditions, derived values -------------------------


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory) -> Path:
    """variables.tf + vertex_rules.tf: no provider, so `terraform plan` runs offline."""
    d = tmp_path_factory.mktemp("vertex_rules")
    for name in ("variables.tf", "vertex_rules.tf"):
        shutil.copy(TF / name, d / name)
    (d / "probe_outputs.tf").write_text(
        'output "endpoint_id" { value = local.vertex_endpoint_id }\n'
        'output "request_timeout" { value = local.vertex_request_timeout_s }\n'
        'output "budget" { value = local.vertex_startup_budget_s }\n')
    return d


REQUIRED = ["-var", "project_id=p", "-var", "model_bucket=b", "-var", "model_path=m/"]


def plan(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([terraform(), "plan", "-input=false", "-lock=false", "-no-color", *REQUIRED, *args],
                          cwd=d, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"})


@pytest.mark.parametrize("args, ok, message", [
    ([], True, ""),
    (["-var", "vertex_machine_type=a3-highgpu-8g"], True, ""),
    (["-var", "vertex_machine_type=a2-highgpu-4g", "-var", "vertex_accelerator_count=4"], True, ""),
    (["-var", "vertex_machine_type=a3-highgpu-8g", "-var", "vertex_accelerator_count=4"], False,
     "carries 8 x NVIDIA_H100_80GB"),
    (["-var", "vertex_machine_type=g2-standard-8", "-var", "vertex_accelerator_type=NVIDIA_H100_80GB"], False,
     "carries 1 x NVIDIA_L4"),
    (["-var", "vertex_machine_type=n1-standard-8"], False, "is not in vertex_gpus"),
    (["-var", "vertex_machine_type=n1-standard-8", "-var", "vertex_accelerator_type=NVIDIA_TESLA_T4",
      "-var", "vertex_accelerator_count=1"], True, ""),
    (["-var", "vertex_accelerator_count=3"], False, "must be 1, 2, 4, 8 or 16"),
    (["-var", "vertex_accelerator_type=nvidia-l4"], False, "AcceleratorType enum name"),
    (["-var", "vertex_min_replicas=2"], False, "vertex_max_replicas must be >= vertex_min_replicas"),
    (["-var", "vertex_min_replicas=0"], False, "vertex_min_replicas must be a whole number >= 1"),
    (["-var", "vertex_startup_probe={period_seconds=10,timeout_seconds=5,failure_threshold=720}"], False,
     "must be greater than period_seconds"),
    (["-var", "vertex_startup_probe={period_seconds=10,timeout_seconds=10,failure_threshold=720}"], False,
     "must be greater than period_seconds"),
    (["-var", "vertex_startup_probe={period_seconds=10,timeout_seconds=15,failure_threshold=3}"], False,
     "under 300 s"),
    (["-var", "deployment_timeout_seconds=3600"], False, "exceeds deployment_timeout_seconds"),
    (["-var", "deployment_timeout_seconds=3600",
      "-var", "vertex_startup_probe={period_seconds=10,timeout_seconds=15,failure_threshold=360}"], True, ""),
    (["-var", "deployment_timeout_seconds=9000"], False, "between 60 and 7200"),
    (["-var", "vertex_endpoint_id=0123"], False, "vertex_endpoint_id must be empty"),
    (["-var", "vertex_endpoint_id=vertex-gguf"], True, ""),
    (["-var", "deploy_vertex=false", "-var", "vertex_machine_type=n1-standard-8"], True, ""),
    (["-var", "vertex_autoscaling_gpu_duty_cycle=70"], True, ""),
    (["-var", "vertex_autoscaling_gpu_duty_cycle=100"], True, ""),
    (["-var", "vertex_autoscaling_gpu_duty_cycle=0"], False, "whole percentage from 1 to 100"),
    (["-var", "vertex_autoscaling_gpu_duty_cycle=101"], False, "whole percentage from 1 to 100"),
    (["-var", "vertex_autoscaling_gpu_duty_cycle=60.5"], False, "whole percentage from 1 to 100"),
    (["-var", 'vertex_invokers=["user:me@example.com","serviceAccount:a@p.iam.gserviceaccount.com"]'], True, ""),
    (["-var", 'vertex_invokers=["me@example.com"]'], False, "Each of vertex_invokers is an IAM member"),
    (["-var", 'vertex_invokers=["allUsers"]'], False, "Each of vertex_invokers is an IAM member"),
])
def test_validations_fail_at_plan_time(rules_dir, args, ok, message):
    proc = plan(rules_dir, *args)
    text = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert (proc.returncode == 0) == ok, text[-3000:]
    assert message in text, text[-3000:]


STUBS = """
locals {
  image_by_digest = "r-docker.pkg.dev/p/vertex-gguf/vertex-gguf@sha256:abc"
  model_uri       = "gs://b/m/"
  port            = 8080
  health_route    = "/health"
  predict_route   = "/predict"
  server_env      = { REQUEST_TIMEOUT = "3590", MODEL_FILE = "*q4*.gguf" }
  stub_sa         = "vertex-gguf-runtime@p.iam.gserviceaccount.com"
}
"""


@pytest.fixture(scope="module")
def bodies_dir(tmp_path_factory) -> Path:
    """vertex.tf's locals block (the REST bodies) with the other files' locals stubbed: real JSON."""
    d = tmp_path_factory.mktemp("vertex_bodies")
    for name in ("variables.tf", "vertex_rules.tf"):
        shutil.copy(TF / name, d / name)
    text = (TF / "vertex.tf").read_text()
    block = text[text.index("locals {"):text.index('resource "google_vertex_ai_endpoint"')]
    (d / "bodies.tf").write_text(block.replace("google_service_account.runtime.email", "local.stub_sa") + STUBS)
    return d


def test_rest_bodies_as_terraform_builds_them(bodies_dir):
    upload = json.loads(json.loads(console(bodies_dir, "local.vertex_upload_body")))
    spec = upload["model"]["containerSpec"]
    assert upload["modelId"] == "__MODEL_ID__"
    assert spec["imageUri"].endswith("@sha256:abc")
    assert spec["ports"] == [{"containerPort": 8080}]
    assert spec["healthRoute"] == "/health" and spec["predictRoute"] == "/predict"
    assert spec["deploymentTimeout"] == "7200s"
    assert spec["startupProbe"] == {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10,
                                    "timeoutSeconds": 15, "failureThreshold": 720}
    env = {e["name"]: e["value"] for e in spec["env"]}
    assert env == {"MODEL": "gs://b/m/", "MODEL_FILE": "*q4*.gguf", "REQUEST_TIMEOUT": "590"}
    assert "artifactUri" not in upload["model"]
    deploy = json.loads(json.loads(console(bodies_dir, "local.vertex_deploy_body",
                                           "-var", "vertex_machine_type=a3-highgpu-8g", "-var", "vertex_max_replicas=2")))
    dm = deploy["deployedModel"]
    assert deploy["trafficSplit"] == {"0": 100}
    assert dm["id"] == "__DEPLOYED_MODEL_ID__"
    assert dm["model"] == "projects/p/locations/us-central1/models/__MODEL_ID__"
    assert dm["serviceAccount"] == "vertex-gguf-runtime@p.iam.gserviceaccount.com"
    assert dm["dedicatedResources"] == {
        "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
        "minReplicaCount": 1, "maxReplicaCount": 2}


def test_deploy_body_autoscaling_as_terraform_builds_it(bodies_dir):
    def resources_of(*args: str) -> dict:
        body = json.loads(json.loads(console(bodies_dir, "local.vertex_deploy_body", *args)))
        return body["deployedModel"]["dedicatedResources"]

    # no target: no autoscalingMetricSpecs at all (Vertex's default; the body, and so the
    # deployment's trigger, is what it was before the variable existed)
    assert "autoscalingMetricSpecs" not in resources_of()
    got = resources_of("-var", "vertex_autoscaling_gpu_duty_cycle=70", "-var", "vertex_max_replicas=3")
    assert got["autoscalingMetricSpecs"] == [
        {"metricName": "aiplatform.googleapis.com/prediction/online/accelerator/duty_cycle", "target": 70}]
    assert got["minReplicaCount"] == 1 and got["maxReplicaCount"] == 3
    assert got["machineSpec"] == {"machineType": "g2-standard-8", "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1}


def console(d: Path, expr: str, *args: str) -> str:
    proc = subprocess.run([terraform(), "console", *REQUIRED, *args], cwd=d, input=expr, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "CHECKPOINT_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def derived_id(text: str) -> str:
    return str(int(hashlib.sha1(text.encode()).hexdigest()[:8], 16))


def test_derived_values(rules_dir):
    assert console(rules_dir, "local.vertex_request_timeout_s") == "590"
    assert console(rules_dir, "local.vertex_startup_budget_s") == "7200"
    assert console(rules_dir, 'local.vertex_gpus["a3-highgpu-8g"].count') == "8"
    assert json.loads(console(rules_dir, "local.vertex_accelerator_type")) == "NVIDIA_L4"
    assert console(rules_dir, "local.vertex_accelerator_count", "-var", "vertex_machine_type=a2-ultragpu-4g") == "4"
    endpoint = json.loads(console(rules_dir, "local.vertex_endpoint_id"))
    assert re.fullmatch(r"[1-9][0-9]{0,9}", endpoint)
    assert endpoint == derived_id("vertex-gguf/p/us-central1/true")
    other = json.loads(console(rules_dir, "local.vertex_endpoint_id", "-var", "region=europe-west4"))
    assert other != endpoint  # a replacement endpoint (new region) never asks for the old id
    assert json.loads(console(rules_dir, "local.vertex_endpoint_id", "-var", "vertex_endpoint_id=42")) == "42"


def test_deployed_model_id_formula_matches_terraform(tmp_path):
    """The script gets digits that fit the API's 1-10 digit deployed-model id; Python mirrors it."""
    triggers = {"project": "p", "region": "r", "endpoint_id": "1", "op_wait": 1800}
    hcl_map = '{project = "p", region = "r", endpoint_id = "1", op_wait = 1800}'
    expr = 'tostring(parseint(substr(sha1("abc/${jsonencode(' + hcl_map + ')}"), 0, 8), 16))'
    proc = subprocess.run([terraform(), "console"], cwd=tmp_path, input=expr, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CHECKPOINT_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip())
    text = "abc/" + json.dumps(triggers, sort_keys=True, separators=(",", ":"))
    assert got == derived_id(text)
    assert re.fullmatch(r"[0-9]{1,10}", got)


# ---- the deploy script, against a fake Vertex AI ----------------------------------------------

FAKE_CURL = r'''#!PYTHON
"""A fake curl in front of an in-memory Vertex AI REST API (state in $FAKE_STATE)."""
import json, os, sys

args = sys.argv[1:]
out = fmt = method = data = url = None
i = 0
while i < len(args):
    a = args[i]
    if a == "-o": out = args[i + 1]; i += 2; continue
    if a == "-w": fmt = args[i + 1]; i += 2; continue
    if a == "-X": method = args[i + 1]; i += 2; continue
    if a == "-H": i += 2; continue
    if a == "--data-binary":
        data = open(args[i + 1][1:]).read(); i += 2; continue
    if a.startswith("https://"): url = a
    i += 1
state_path = os.environ["FAKE_STATE"]
st = json.load(open(state_path))
path = url.split("/v1/", 1)[1]
body = json.loads(data) if data else None
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"method": method, "path": path, "body": body}) + "\n")
code, answer = 200, {}

def op(name, error=None):
    st["ops"][name] = {"polls": st.get("polls", 1), "error": error}
    return {"name": name, "metadata": {}}

if path.endswith("models:upload"):
    mid = body["modelId"]
    st["models"].append(mid)
    answer = op(f"{path.rsplit('/', 1)[0]}/models/{mid}/operations/{len(st['ops']) + 1}")
elif ":deployModel" in path:
    ep = path.split(":")[0]
    dm = body["deployedModel"]
    fail = st.get("fail_deploy")
    if not fail:
        st["deployed"][dm["id"]] = dm["model"].rsplit("/", 1)[1]
        st["traffic"] = {k: 0 for k in st["deployed"]}
        st["traffic"][dm["id"]] = body["trafficSplit"]["0"]
    answer = op(f"{ep}/operations/{len(st['ops']) + 1}", {"code": 9, "message": "health check failed"} if fail else None)
elif ":undeployModel" in path:
    ep = path.split(":")[0]
    dmid = body["deployedModelId"]
    if st["traffic"].get(dmid) and len(st["deployed"]) > 1:
        code, answer = 400, {"error": {"message": "still has traffic"}}
    else:
        st["deployed"].pop(dmid)
        st["traffic"].pop(dmid, None)
        answer = op(f"{ep}/operations/{len(st['ops']) + 1}")
elif "/operations/" in path:
    o = st["ops"][path]
    o["polls"] -= 1
    answer = {"name": path}
    if o["polls"] <= 0 and not st.get("never_done"):
        answer["done"] = True
        if o["error"]: answer["error"] = o["error"]
elif "/models/" in path and method == "DELETE":
    mid = path.rsplit("/", 1)[1]
    if mid in st["deployed"].values():
        code, answer = 400, {"error": {"message": "model is deployed"}}
    else:
        st["models"].remove(mid)
        answer = op(f"{path}/operations/{len(st['ops']) + 1}")
elif "/models/" in path:
    mid = path.rsplit("/", 1)[1]
    if mid in st["models"]:
        answer = {"name": path}
    else:
        code, answer = 404, {"error": {"code": 404, "message": "not found"}}
elif "/endpoints/" in path:
    answer = {"name": path, "deployedModels": [{"id": k, "model": v} for k, v in st["deployed"].items()],
              "trafficSplit": st["traffic"]}
    if not st["deployed"]:
        answer = {"name": path}
json.dump(st, open(state_path, "w"))
open(out, "w").write(json.dumps(answer, indent=2))
sys.stdout.write(str(code))
'''

FAKE_GCLOUD = r'''#!/bin/sh
printf '%s\n' "$*" >> "$FAKE_GCLOUD_LOG"
case "$*" in
  "auth print-access-token") echo fake-token ;;
  *) echo "unexpected gcloud call: $*" >&2; exit 1 ;;
esac
'''

UPLOAD_BODY = json.dumps({"modelId": "__MODEL_ID__", "model": {"displayName": "__MODEL_ID__", "containerSpec": {
    "imageUri": "r-docker.pkg.dev/p/vertex-gguf/vertex-gguf:v1",
    "env": [{"name": "MODEL", "value": "gs://b/m/"}, {"name": "REQUEST_TIMEOUT", "value": "590"}],
    "startupProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10, "timeoutSeconds": 15,
                     "failureThreshold": 720}}}})
DEPLOY_BODY = json.dumps({"deployedModel": {"id": "__DEPLOYED_MODEL_ID__",
                                            "model": "projects/p/locations/r/models/__MODEL_ID__",
                                            "displayName": "__MODEL_ID__",
                                            "dedicatedResources": {"machineSpec": {"machineType": "a3-highgpu-8g"}}},
                          "trafficSplit": {"0": 100}})


class FakeVertex:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.bin.mkdir()
        (self.bin / "curl").write_text(FAKE_CURL.replace("#!PYTHON", f"#!{sys.executable}"))
        (self.bin / "gcloud").write_text(FAKE_GCLOUD)
        for f in ("curl", "gcloud"):
            (self.bin / f).chmod(0o755)
        self.state = tmp / "state.json"
        self.log = tmp / "calls.jsonl"
        self.gcloud_log = tmp / "gcloud.log"
        self.state.write_text(json.dumps({"models": [], "deployed": {}, "traffic": {}, "ops": {}}))

    def run(self, action: str, deployed_id: str, bash: str = "bash", **extra) -> subprocess.CompletedProcess:
        env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": str(self.tmp), "TMPDIR": str(self.tmp),
               "FAKE_STATE": str(self.state), "FAKE_LOG": str(self.log), "FAKE_GCLOUD_LOG": str(self.gcloud_log),
               "PROJECT": "p", "REGION": "r", "ENDPOINT_ID": "123", "DEPLOYED_MODEL_ID": deployed_id,
               "UPLOAD_BODY": UPLOAD_BODY, "DEPLOY_BODY": DEPLOY_BODY, "POLL_S": "0",
               "OP_WAIT_S": "5", "DEPLOY_WAIT_S": "5", **extra}
        self.log.write_text("")
        return subprocess.run([bash, str(SCRIPT), action], env=env, capture_output=True, text=True, timeout=60)

    def calls(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def mutations(self) -> list[tuple[str, str]]:
        return [(c["method"], c["path"]) for c in self.calls() if c["method"] != "GET"]

    def st(self) -> dict:
        return json.loads(self.state.read_text())

    def set(self, **kw):
        st = self.st()
        st.update(kw)
        self.state.write_text(json.dumps(st))


EP = "projects/p/locations/r/endpoints/123"


@pytest.fixture
def vertex(tmp_path) -> FakeVertex:
    return FakeVertex(tmp_path)


def test_first_deploy(vertex):
    proc = vertex.run("deploy", "1111")
    assert proc.returncode == 0, proc.stderr
    assert vertex.mutations() == [("POST", "projects/p/locations/r/models:upload"), ("POST", f"{EP}:deployModel")]
    upload, deploy = (c["body"] for c in vertex.calls() if c["method"] == "POST")
    assert upload["modelId"] == "vertex-gguf-1111" and upload["model"]["displayName"] == "vertex-gguf-1111"
    assert upload["model"]["containerSpec"]["startupProbe"]["failureThreshold"] == 720
    assert deploy["deployedModel"]["id"] == "1111"
    assert deploy["deployedModel"]["model"] == "projects/p/locations/r/models/vertex-gguf-1111"
    assert deploy["trafficSplit"] == {"0": 100}
    assert vertex.st()["deployed"] == {"1111": "vertex-gguf-1111"} and vertex.st()["traffic"] == {"1111": 100}
    assert vertex.gcloud_log.read_text().splitlines() and set(vertex.gcloud_log.read_text().splitlines()) == {
        "auth print-access-token"}
    # run again (Terraform never does for one instance, a person might): nothing is redone
    proc = vertex.run("deploy", "1111")
    assert proc.returncode == 0 and vertex.mutations() == []


def test_redeploy_new_beside_old_then_only_the_old_one_goes(vertex):
    assert vertex.run("deploy", "1111").returncode == 0
    # create_before_destroy: the new instance deploys first ...
    proc = vertex.run("deploy", "2222")
    assert proc.returncode == 0, proc.stderr
    assert vertex.mutations() == [("POST", "projects/p/locations/r/models:upload"), ("POST", f"{EP}:deployModel")]
    st = vertex.st()
    assert st["deployed"] == {"1111": "vertex-gguf-1111", "2222": "vertex-gguf-2222"}
    assert st["traffic"] == {"1111": 0, "2222": 100}  # both up, all traffic on the new one: no gap
    # ... then the old instance's destroy undeploys exactly its own deployed model and Model
    proc = vertex.run("undeploy", "1111")
    assert proc.returncode == 0, proc.stderr
    assert vertex.mutations() == [("POST", f"{EP}:undeployModel"),
                                  ("DELETE", "projects/p/locations/r/models/vertex-gguf-1111")]
    assert [c["body"] for c in vertex.calls() if c["path"].endswith(":undeployModel")] == [{"deployedModelId": "1111"}]
    st = vertex.st()
    assert st["deployed"] == {"2222": "vertex-gguf-2222"} and st["traffic"] == {"2222": 100}
    assert st["models"] == ["vertex-gguf-2222"]
    assert not any("2222" in path for _, path in vertex.mutations())


def test_destroy_and_destroy_of_nothing(vertex):
    assert vertex.run("deploy", "3333").returncode == 0
    proc = vertex.run("undeploy", "3333")
    assert proc.returncode == 0, proc.stderr
    assert vertex.st()["deployed"] == {} and vertex.st()["models"] == []
    # an empty endpoint (first deploy never ran, or a second destroy): no call changes anything,
    # and set -u has nothing empty to trip over
    proc = vertex.run("undeploy", "3333")
    assert proc.returncode == 0, proc.stderr
    assert vertex.mutations() == []


def test_failed_deploy_removes_its_model_and_leaves_the_old_one(vertex):
    assert vertex.run("deploy", "1111").returncode == 0
    vertex.set(fail_deploy=True)
    proc = vertex.run("deploy", "2222")
    assert proc.returncode != 0
    assert "health check failed" in proc.stderr
    assert ("DELETE", "projects/p/locations/r/models/vertex-gguf-2222") in vertex.mutations()
    st = vertex.st()
    assert st["deployed"] == {"1111": "vertex-gguf-1111"} and st["traffic"] == {"1111": 100}
    assert st["models"] == ["vertex-gguf-1111"]


def test_waits_are_bounded(vertex):
    vertex.set(never_done=True)
    proc = vertex.run("deploy", "1111", OP_WAIT_S="3")
    assert proc.returncode != 0
    assert "still running after 3 s" in proc.stderr
    polls = [c["path"] for c in vertex.calls() if "/operations/" in c["path"]]
    assert polls and all(polls.count(op) <= 4 for op in polls)  # 3 s at POLL_S=0: one tick per poll


def test_rejects_a_non_numeric_deployed_model_id(vertex):
    proc = vertex.run("deploy", "abc")
    assert proc.returncode == 2 and vertex.calls() == []


# ---- bash 3.2 (macOS) ----------------------------------------------------------------------


BASH4_ONLY = {
    r"\[@\]|\[\*\]": 'arrays ("${a[@]}" of an empty array is unbound under set -u before bash 4.4)',
    r"\b(declare|typeset|local)\s+-[a-zA-Z]*[An]": "associative arrays / namerefs (bash 4+)",
    r"\b(mapfile|readarray|coproc)\b": "bash 4 builtins",
    r"\bread\s+(-\w+\s+)*-a\b": "read -a into an array",
    r"\$\{[^}]*(,,|\^\^)[^}]*\}": "case modification (bash 4)",
    r"&>>|\|&|;;&|;&": "bash 4 redirections / case fall-through",
    r"\bwait\s+-n\b|EPOCHREALTIME|EPOCHSECONDS|\$\{[^}]*@[QEPAa]\}": "bash 4.3+/5 features",
}


def test_script_avoids_what_bash_3_2_lacks():
    code = "\n".join(line for line in SCRIPT.read_text().splitlines() if not line.lstrip().startswith("#"))
    for pattern, why in BASH4_ONLY.items():
        assert not re.search(pattern, code), why


def test_script_never_lets_grep_q_or_head_close_a_pipe_early():
    """Under pipefail, `printf ... | grep -q` fails at random when grep exits before the writer."""
    code = "\n".join(line for line in SCRIPT.read_text().splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"\|\s*(grep\s+-\w*q|head)\b", code)


def test_shellcheck_as_bash():
    proc = subprocess.run([shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck"),
                           "--shell=bash", "--severity=style", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_nounset_with_nothing_deployed_and_no_optional_env(vertex):
    """The D7 case: set -u, an endpoint with nothing on it, optional variables unset."""
    assert "set -euo pipefail" in SCRIPT.read_text()
    env_min = {"UPLOAD_BODY": UPLOAD_BODY, "DEPLOY_BODY": DEPLOY_BODY}
    proc = vertex.run("undeploy", "4444", **env_min)
    assert proc.returncode == 0, proc.stderr
    assert "unbound variable" not in proc.stderr
    proc = vertex.run("deploy", "4444")
    assert proc.returncode == 0 and "unbound variable" not in proc.stderr


def test_script_with_the_bodies_terraform_builds(vertex, bodies_dir):
    upload = json.loads(console(bodies_dir, "local.vertex_upload_body"))
    deploy = json.loads(console(bodies_dir, "local.vertex_deploy_body"))
    proc = vertex.run("deploy", "5555", UPLOAD_BODY=upload, DEPLOY_BODY=deploy)
    assert proc.returncode == 0, proc.stderr
    sent = [c["body"] for c in vertex.calls() if c["method"] == "POST"]
    assert "__" not in json.dumps(sent)
    assert sent[0]["modelId"] == "vertex-gguf-5555" and sent[1]["deployedModel"]["id"] == "5555"
    assert sent[1]["deployedModel"]["model"] == "projects/p/locations/us-central1/models/vertex-gguf-5555"
