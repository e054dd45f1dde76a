"""The deploy artifacts, checked offline: Dockerfile, cloudbuild.yaml, terraform/, scripts.

Nothing here reaches Google or needs a Docker engine: linters (hadolint, check-jsonschema with
the bundled Cloud Build schema, yamllint, shellcheck, checkov in its own venv) and structural
assertions over the parsed files, plus one test that the port, routes, env var names and image
reference agree across the app, the Dockerfile, cloudbuild.yaml and Terraform.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from pathlib import Path

import hcl2
import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.settings import Settings
from app.settings_doc import env_names
from tests.support.deploy_files import (
    ROOT,
    TF,
    cloudbuild_config,
    docker_args,
    dockerfile_parser,
    run,
    tf_blocks,
    tf_locals,
    tool,
    unq,
)


def tf_resources() -> dict[tuple[str, str], dict]:
    return tf_blocks("resource")


def tf_variables() -> dict[str, dict]:
    return tf_blocks("variable", ["variables.tf"])


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    return dockerfile_parser()


@pytest.fixture(scope="module")
def cloudbuild() -> dict:
    return cloudbuild_config()


# ---- Dockerfile ------------------------------------------------------------------------------


def test_hadolint_clean():
    proc = run([tool("hadolint"), "Dockerfile"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_structure(dockerfile):
    stages = [i for i in dockerfile.structure if i["instruction"] == "FROM"]
    assert len(stages) == 2
    assert stages[0]["value"] == "${BUILD_IMAGE} AS build"
    assert stages[-1]["value"] == "${RUNTIME_IMAGE} AS runtime"
    args = docker_args(dockerfile)
    assert "devel" in args["BUILD_IMAGE"] and "-base-" in args["RUNTIME_IMAGE"]  # + cuBLAS, NCCL (test_deploy_build)
    assert args["CUDA_VERSION"].startswith("12.")  # a 12.x runs on Cloud Run's 535 driver (minor-version compatibility)
    assert args["CUDA_ARCHS"] == "80;89;90;120"  # A100, L4, H100 and H200, RTX PRO 6000
    final = dockerfile.structure[dockerfile.structure.index(stages[-1]):]
    users = [i["value"] for i in final if i["instruction"] == "USER"]
    assert users and users[-1] not in {"root", "0"}
    entry = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["vertex-gguf"]  # exec form
    run_lines = " ".join(i["value"] for i in dockerfile.structure if i["instruction"] == "RUN")
    # llama.cpp compiles through scripts/build-llama-wheel.sh (its flags: test_build.py)
    assert 'CUDA_ARCHS="${CUDA_ARCHS}"' in run_lines and "build-llama-wheel.sh \"$BACKEND\"" in run_lines
    assert "pip install --no-deps ." in run_lines  # the app as CI installs it, its dependencies from the lock
    # no compilers in the runtime stage
    final_runs = " ".join(i["value"] for i in final if i["instruction"] == "RUN")
    assert "build-essential" not in final_runs and "cmake" not in final_runs
    assert any(i["instruction"] == "COPY" and "--from=build /opt/venv" in i["value"] for i in final)


def test_dockerfile_sets_no_aip_variable(dockerfile):
    for inst in dockerfile.structure:
        if inst["instruction"] in {"ENV", "ARG"}:
            assert "AIP_" not in inst["value"], inst


LOCK = ROOT / "requirements" / "image.lock"


def lock_pins() -> dict[str, tuple[str, list[str]]]:
    """requirements/image.lock as {normalized name: (version, hashes)}; every line must be a pin."""
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())  # join the backslash-continued lines
    pins = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req, *options = [part.strip() for part in line.split(" --")]
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", req.strip()), f"not pinned with ==: {line}"
        hashes = [o.removeprefix("hash=") for o in options if o.startswith("hash=sha256:")]
        assert hashes and len(hashes) == len(options), f"without --hash=sha256: (or with another option): {line}"
        name, version = req.strip().split("==")
        pins[canonicalize_name(name)] = (version, hashes)
    return pins


def test_image_dependencies_come_from_a_hashed_lock(dockerfile):
    """R11: the image installs requirements/image.lock with --require-hashes, then the app --no-deps."""
    pins = lock_pins()
    assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for _, hashes in pins.values() for h in hashes)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:  # the runtime dependencies, each pinned inside its range
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is missing from the lock: regenerate it (see the Dockerfile)"
        assert req.specifier.contains(pins[name][0], prereleases=True), f"{dep} vs {pins[name][0]}"
    # the video extra (the image's ffmpeg) too, each pinned exactly; WITH_FFMPEG=0 uninstalls it
    for dep in project["optional-dependencies"]["video"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} (video extra) is missing from the lock: regenerate it"
        assert str(req.specifier) == f"=={pins[name][0]}", f"{dep} vs {pins[name][0]}"
    assert 'if [ "$WITH_FFMPEG" != "1" ]; then pip uninstall -y imageio-ffmpeg; fi' in (
        ROOT / "Dockerfile").read_text()
    deps = [Requirement(d) for d in project["dependencies"]]
    llama = next(r for r in deps if r.name == "llama-cpp-python")
    assert str(llama.specifier) == f"=={pins['llama-cpp-python'][0]}"  # pyproject's exact pin
    assert len(pins["llama-cpp-python"][1]) == 1  # its only file: the sdist, compiled in the image
    # not the test extra: none of its packages that the runtime does not need
    for dep in project["optional-dependencies"]["test"]:
        name = canonicalize_name(Requirement(dep).name)
        assert name not in pins or name == "requests", f"test-only {name} in the image lock"  # requests: storage's
    assert "vertex-gguf" not in pins
    # the Dockerfile: llama-cpp-python's wheel (built from the lock's sdist by the script, or
    # given in wheels/), then the lock with --require-hashes, then the app without dependencies,
    # then pip check
    runs = [i["value"] for i in dockerfile.structure if i["instruction"] == "RUN"]
    lock_run = next(r for r in runs if "--require-hashes" in r)
    assert "LOCK=/tmp/build/image.lock /tmp/build/build-llama-wheel.sh" in lock_run
    wheel = lock_run.index("pip install --no-deps /tmp/build/wheels/llama_cpp_python-*.whl")
    assert wheel < lock_run.index("pip install --require-hashes -r /tmp/build/image.lock")
    app_run = next(r for r in runs if "pip install --no-deps ." in r)
    assert "pip check" in app_run
    assert runs.index(lock_run) < runs.index(app_run)
    allowed = r'pip install (?!--upgrade "pip==|--require-hashes|--no-deps \.|--no-deps /tmp/build/wheels/)'
    assert not any(re.search(allowed, r) for r in runs), runs
    copies = [i["value"] for i in dockerfile.structure if i["instruction"] == "COPY"]
    assert "requirements/image.lock scripts/build-llama-wheel.sh /tmp/build/" in copies
    assert "wheels/ /tmp/build/wheels/" in copies
    assert "LLAMA_CPP_PYTHON_VERSION" not in docker_args(dockerfile)  # one pin, in pyproject and the lock
    assert "uv pip compile --generate-hashes" in (ROOT / "Dockerfile").read_text()  # how to regenerate


def test_dockerignore_keeps_the_build_context_small():
    text = (ROOT / ".dockerignore").read_text()
    assert text.splitlines()[1] == "*" or "*" in text.splitlines()
    for needed in ("!requirements/image.lock", "!pyproject.toml", "!README.md", "!app/"):
        assert needed in text


# ---- cloudbuild.yaml -------------------------------------------------------------------------


def test_cloudbuild_schema_and_lint():
    proc = run([tool("check-jsonschema"), "--builtin-schema", "vendor.cloudbuild", "cloudbuild.yaml"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run([tool("yamllint"), "-d", "{extends: default, rules: {line-length: {max: 130}, document-start: disable}}",
                "cloudbuild.yaml"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cloudbuild_builds_and_pushes_the_tagged_image(cloudbuild):
    subs = cloudbuild["substitutions"]
    assert set(subs) >= {"_REGION", "_REPOSITORY", "_IMAGE", "_TAG", "_CUDA_ARCHS"}
    image = "${_REGION}-docker.pkg.dev/${PROJECT_ID}/${_REPOSITORY}/${_IMAGE}:${_TAG}"
    assert cloudbuild["images"] == [image]
    build = next(s for s in cloudbuild["steps"] if s.get("id") == "build")
    args = build["args"]
    assert f"--tag={image}" in args
    assert "--build-arg=CUDA_ARCHS=${_CUDA_ARCHS}" in args
    assert any(a.startswith("--cache-from=type=registry") for a in args)
    assert any(a.startswith("--cache-to=type=registry") and "mode=max" in a for a in args)
    assert int(cloudbuild["timeout"].rstrip("s")) >= 3600
    assert cloudbuild["options"]["machineType"].startswith("E2_HIGHCPU")


# ---- Terraform -------------------------------------------------------------------------------


def test_terraform_cloud_run_gpu_service():
    res = tf_resources()
    svc = res[("google_cloud_run_v2_service", "llm")]
    tmpl = svc["template"][0]
    assert tmpl["gpu_zonal_redundancy_disabled"] is True
    assert unq(tmpl["node_selector"][0]["accelerator"]) == "nvidia-l4"
    assert unq(tmpl["timeout"]) == "${var.request_timeout_seconds}s"
    container = tmpl["containers"][0]
    limits = {unq(k): unq(v) for k, v in container["resources"][0]["limits"].items()}
    assert limits["nvidia.com/gpu"] == "1"
    assert container["resources"][0]["cpu_idle"] is False
    variables = tf_variables()
    assert int(unq(variables["cloud_run_cpu"]["default"])) >= 4
    assert int(unq(variables["cloud_run_memory"]["default"]).rstrip("Gi")) >= 16
    assert variables["request_timeout_seconds"]["default"] <= 3600
    probe = container["startup_probe"][0]["http_get"][0]
    assert probe["path"] == "${local.health_route}" and probe["port"] == "${local.port}"
    assert container["ports"][0]["container_port"] == "${local.port}"
    assert container["image"] == "${local.image_by_digest}"
    env_names_set = {unq(e["name"]) for e in container["env"]}
    assert "MODEL" in env_names_set
    assert ("google_cloud_run_v2_service_iam_member", "invokers") in res
    assert unq(res[("google_cloud_run_v2_service_iam_member", "invokers")]["role"]) == "roles/run.invoker"
    assert tmpl["service_account"] == "${google_service_account.runtime.email}"


def test_terraform_vertex_endpoint_and_deployment():
    res = tf_resources()
    assert ("google_vertex_ai_endpoint", "llm") in res
    deploy = res[("terraform_data", "vertex_deployment")]
    triggers = deploy["triggers_replace"]
    assert triggers["image"] == "${local.image_by_digest}" and triggers["model_uri"] == "${local.model_uri}"
    execs = [p['"local-exec"'] for p in deploy["provisioner"]]
    env = execs[0]["environment"]
    assert env["UPLOAD_BODY"] == "${self.triggers_replace.upload_body}"
    assert triggers["upload_body"] == "${local.vertex_upload_body}"
    upload = tf_locals()["vertex_upload_body"]  # the container spec (REST models.upload)
    for field in ("imageUri = local.image_by_digest", "containerPort = local.port", "healthRoute = local.health_route",
                  "predictRoute = local.predict_route", "deploymentTimeout = "):
        assert field in upload
    assert unq(execs[1]["when"]) in {"destroy", "${destroy}"}
    variables = tf_variables()
    assert unq(variables["vertex_machine_type"]["default"]).startswith("g2-standard")
    assert variables["vertex_accelerator_type"]["default"] is None  # follows the machine type (vertex_rules.tf)
    assert variables["deployment_timeout_seconds"]["default"] >= 1800


def test_terraform_shared_resources_and_bucket_access():
    res = tf_resources()
    assert ("google_artifact_registry_repository", "images") in res
    bucket = res[("google_storage_bucket", "models")]
    assert bucket["uniform_bucket_level_access"] is True
    binding = res[("google_storage_bucket_iam_member", "runtime_reads_models")]
    assert binding["bucket"] == "${google_storage_bucket.models.name}"
    assert unq(binding["role"]) == "roles/storage.objectViewer"
    assert unq(binding["member"]) == "serviceAccount:${google_service_account.runtime.email}"
    apis = res[("google_project_service", "apis")]["for_each"]
    for api in ("aiplatform", "run", "artifactregistry", "storage"):
        assert f"{api}.googleapis.com" in apis


def test_terraform_variables_are_described_and_example_covers_required():
    variables = tf_variables()
    for name, body in variables.items():
        assert unq(body.get("description", "")), f"variable {name} has no description"
    required = {n for n, b in variables.items() if "default" not in b}
    example = (TF / "terraform.tfvars.example").read_text()
    for name in required:
        assert re.search(rf"^{name}\s*=", example, re.M), name
    outputs = hcl2.load((TF / "outputs.tf").open())["output"]
    names = {unq(k) for block in outputs for k in block}
    assert {"vertex_endpoint_id", "cloud_run_url"} <= names


def test_shellcheck_scripts():
    scripts = [ROOT / ".ci" / "run", *sorted((TF / "scripts").glob("*.sh"))]
    proc = run([tool("shellcheck"), *map(str, scripts)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def checkov_binary() -> str | None:
    candidates = [os.environ.get("CHECKOV"), str(ROOT / ".venv-checkov" / "bin" / "checkov"), shutil.which("checkov")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


@pytest.mark.parametrize("target", [["-d", "terraform", "--framework", "terraform"],
                                    ["-f", "Dockerfile", "--framework", "dockerfile"]])
def test_checkov(target):
    binary = checkov_binary()
    if binary is None:
        if os.environ.get("CI_REQUIRE_ALL"):
            pytest.fail("checkov is not installed (.ci/run installs it into .venv-checkov)")
        pytest.skip("checkov not installed: .ci/run installs it into .venv-checkov")
    proc = run([binary, *target, "--quiet", "--compact", "--skip-download"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# ---- one consistency test across all of them --------------------------------------------------


def test_port_routes_env_and_image_agree_everywhere(dockerfile, cloudbuild):
    defaults = Settings.model_fields
    port = defaults["port"].default
    health = defaults["health_route"].default
    predict = defaults["predict_route"].default
    # Dockerfile
    assert f"EXPOSE {port}" in (ROOT / "Dockerfile").read_text()
    # Terraform locals feed both platforms
    loc = tf_locals()
    assert loc["port"] == port and loc["health_route"] == health and loc["predict_route"] == predict
    # every env var Terraform sets is one the server reads
    known = {e.upper() for info in defaults.values() for e in env_names(info)}
    tf_text = "".join(f.read_text() for f in TF.glob("*.tf"))
    set_env = set(re.findall(r'name\s*=\s*"([A-Z_]+)"', tf_text)) | set(re.findall(r"\b([A-Z_]+) = ", loc["server_env"]))
    assert set_env and set_env <= known, set_env - known
    # the image Terraform deploys is the one Cloud Build pushes, with matching defaults
    subs = cloudbuild["substitutions"]
    variables = tf_variables()
    assert loc["image"] == "${var.region}-docker.pkg.dev/${var.project_id}/${var.repository}/${var.image_name}:${var.image_tag}"
    assert unq(variables["region"]["default"]) == subs["_REGION"]
    assert unq(variables["repository"]["default"]) == subs["_REPOSITORY"]
    assert unq(variables["image_name"]["default"]) == subs["_IMAGE"]
    assert unq(variables["image_tag"]["default"]) == subs["_TAG"]
    assert docker_args(dockerfile)["CUDA_ARCHS"] == subs["_CUDA_ARCHS"]
    # the exec startup probe Vertex runs is a real command of the CLI
    from app.process.cli import COMMANDS

    assert "probe" in COMMANDS
