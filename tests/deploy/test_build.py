"""The build, Cloud Run and bootstrap side of the deploy artifacts, checked offline.

Terraform parsed with python-hcl2 (and, where the terraform binary is installed, its variable
validations run by terraform itself on the variable blocks alone: no provider needed); the
Dockerfile with dockerfile-parse and hadolint; cloudbuild.yaml with check-jsonschema and yamllint,
and its bake-model step's script run with a fake gcloud; .gcloudignore with gcloud's own file
lister when gcloud is installed; scripts/deploy.sh with shellcheck and run end to end with a fake
`gcloud` and a fake `terraform` on PATH that record their argv, so the bootstrap order is asserted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from tests.support.deploy_files import (
    ROOT,
    TF,
    cloudbuild_config,
    docker_args,
    dockerfile_parser,
    tf_blocks,
    tf_locals,
    tool,
    unq,
)

DEPLOY = ROOT / "scripts" / "deploy.sh"

# Cloud Run's startup probe limits: failure_threshold x period_seconds <= 240 s, initial delay <= 240 s.
CLOUD_RUN_PROBE_WINDOW_MAX = 240
CLOUD_RUN_INITIAL_DELAY_MAX = 240


def cloud_run_container() -> dict:
    svc = tf_blocks("resource")[("google_cloud_run_v2_service", "llm")]
    return svc["template"][0]["containers"][0]


# ---- Cloud Run: the startup probe (D3) -------------------------------------------------------


def test_cloud_run_startup_probe_fits_cloud_runs_limits():
    probe = cloud_run_container()["startup_probe"][0]
    variables = tf_blocks("variable")
    loc = tf_locals()
    assert probe["initial_delay_seconds"] == "${var.cloud_run_startup_initial_delay_seconds}"
    assert probe["failure_threshold"] == "${var.cloud_run_startup_failure_threshold}"
    assert probe["period_seconds"] == "${local.cloud_run_startup_period_seconds}"
    period = loc["cloud_run_startup_period_seconds"]
    assert probe["timeout_seconds"] <= period  # Cloud Run: timeout <= period
    threshold = variables["cloud_run_startup_failure_threshold"]["default"]
    delay = variables["cloud_run_startup_initial_delay_seconds"]["default"]
    assert threshold >= 1 and threshold * period <= CLOUD_RUN_PROBE_WINDOW_MAX
    assert 0 <= delay <= CLOUD_RUN_INITIAL_DELAY_MAX
    # the validations bound the same arithmetic, with the same period
    cond = variables["cloud_run_startup_failure_threshold"]["validation"][0]["condition"]
    assert f"var.cloud_run_startup_failure_threshold * {period} <= {CLOUD_RUN_PROBE_WINDOW_MAX}" in cond
    cond = variables["cloud_run_startup_initial_delay_seconds"]["validation"][0]["condition"]
    assert f"<= {CLOUD_RUN_INITIAL_DELAY_MAX}" in cond
    # the old 30-minute variable is not what the service uses
    assert "startup_probe_failure_threshold" not in (TF / "cloud_run.tf").read_text().split("resource", 1)[1]


def variable_blocks(path: Path, names: list[str]) -> str:
    """The raw text of some `variable` blocks (each ends at the first `}` in column 0)."""
    text = path.read_text()
    out = []
    for name in names:
        m = re.search(rf'^variable "{name}" \{{\n.*?^\}}\n', text, re.M | re.S)
        assert m, name
        out.append(m.group(0))
    return "\n".join(out)


@pytest.mark.parametrize(("name", "good", "bad"), [
    ("cloud_run_startup_failure_threshold", [1, 24], [0, 25, 180, 2.5]),
    ("cloud_run_startup_initial_delay_seconds", [0, 120, 240], [-1, 241, 1.5]),
])
def test_terraform_itself_rejects_probe_values_past_cloud_runs_limits(tmp_path, name, good, bad):
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform not installed (the static test above still checks the arithmetic)")
    (tmp_path / "main.tf").write_text(variable_blocks(TF / "cloud_run.tf", [name]))
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}

    def plan(value) -> subprocess.CompletedProcess:
        return subprocess.run([terraform, "plan", "-input=false", "-no-color", f"-var={name}={value}"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)

    init = subprocess.run([terraform, "init", "-input=false", "-no-color"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert init.returncode == 0, init.stdout + init.stderr
    for value in good:
        proc = plan(value)
        assert proc.returncode == 0, (value, proc.stdout + proc.stderr)
    for value in bad:
        proc = plan(value)
        assert proc.returncode != 0 and "Invalid value for variable" in proc.stderr, (value, proc.stdout + proc.stderr)


def test_terraform_fmt_clean():
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform not installed")
    files = ["build.tf", "cloud_run.tf", "main.tf"]
    proc = subprocess.run([terraform, "fmt", "-check", "-diff", *files], cwd=TF, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cloud_run_region_and_baked_model():
    svc = tf_blocks("resource")[("google_cloud_run_v2_service", "llm")]
    assert svc["location"] == "${local.cloud_run_region}"
    invokers = tf_blocks("resource")[("google_cloud_run_v2_service_iam_member", "invokers")]
    assert invokers["location"] == "${local.cloud_run_region}"
    loc = tf_locals()
    assert "var.cloud_run_region" in loc["cloud_run_region"] and "var.region" in loc["cloud_run_region"]
    # a region without L4 GPUs is a plan-time warning (a check block), not a silent failure
    checks = tf_blocks("check")
    assert "local.cloud_run_region" in checks["cloud_run_gpu_region"]["assert"][0]["condition"]
    # MODEL: the bucket, or the copy baked into the image at /opt/model
    env = {unq(e["name"]): unq(e["value"]) for e in cloud_run_container()["env"] if "name" in e}
    assert env["MODEL"] == "${local.cloud_run_model}"
    assert "/opt/model" in loc["cloud_run_model"] and "local.model_uri" in loc["cloud_run_model"]


# ---- the image by digest (R4) ----------------------------------------------------------------


def test_deployments_run_the_image_by_digest():
    assert cloud_run_container()["image"] == "${local.image_by_digest}"
    data = tf_blocks("data")[("google_artifact_registry_docker_image", "app")]
    assert data["repository_id"] == "${google_artifact_registry_repository.images.repository_id}"
    assert data["location"] == "${google_artifact_registry_repository.images.location}"
    assert unq(data["image_name"]) == "${var.image_name}:${var.image_tag}"
    assert tf_locals()["image_by_digest"] == "${one(data.google_artifact_registry_docker_image.app[*].self_link)}"
    outputs = tf_blocks("output")
    assert outputs["image_by_digest"]["value"] == "${local.image_by_digest}"


# ---- Artifact Registry cleanup (R10, review section 4 item 10) ---------------------------------


def test_registry_cleanup_deletes_only_untagged_and_keeps_recent_versions():
    repo = tf_blocks("resource")[("google_artifact_registry_repository", "images")]
    assert repo["cleanup_policy_dry_run"] is False  # the policies act, not only report
    policies = {unq(p["id"]): p for p in repo["cleanup_policies"]}
    assert {unq(p["action"]) for p in policies.values()} == {"DELETE", "KEEP"}
    deletes = [p for p in policies.values() if unq(p["action"]) == "DELETE"]
    assert len(deletes) == 1  # the only DELETE: untagged versions past the retention
    cond = deletes[0]["condition"][0]
    assert unq(cond["tag_state"]) == "UNTAGGED"
    assert cond["older_than"] == "${local.registry_untagged_older_than}"
    # what the deployments resolve (image_tag) is kept explicitly, whatever DELETE is added later
    keep_tag = policies["keep-tagged-image"]
    assert unq(keep_tag["action"]) == "KEEP"
    assert unq(keep_tag["condition"][0]["tag_state"]) == "TAGGED"
    assert keep_tag["condition"][0]["tag_prefixes"] == ["${var.image_tag}"]
    # the most recent versions of the image package (images and buildcache manifests) are kept
    recent = policies["keep-recent-versions"]
    assert unq(recent["action"]) == "KEEP"
    mrv = recent["most_recent_versions"][0]
    assert mrv["keep_count"] == "${var.registry_keep_recent_versions}"
    assert mrv["package_name_prefixes"] == ["${var.image_name}"]
    # buildcache lives in the same package as the image (cloudbuild.yaml's --cache-to), so the
    # policies above are the ones that apply to it
    build_args = " ".join(yaml.safe_load((ROOT / "cloudbuild.yaml").read_text())["steps"][-1]["args"])
    assert "/${_IMAGE}:buildcache" in build_args
    variables = tf_blocks("variable")
    assert variables["registry_untagged_retention_days"]["default"] >= 1
    assert variables["registry_keep_recent_versions"]["default"] >= 2


def test_registry_cleanup_values_as_terraform_evaluates_them(tmp_path):
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform not installed (the static test above still checks the policies)")
    names = ["registry_untagged_retention_days", "registry_keep_recent_versions"]
    text = (TF / "main.tf").read_text()
    loc = re.search(r"^locals \{\n  # older_than.*?^\}\n", text, re.M | re.S)
    assert loc
    (tmp_path / "main.tf").write_text(variable_blocks(TF / "main.tf", names) + "\n" + loc.group(0))
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}

    def console(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([terraform, "console", *args], cwd=tmp_path, input="local.registry_untagged_older_than",
                              capture_output=True, text=True, timeout=120, env=env)

    proc = console()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip()) == "1209600s"  # 14 days, in the API's seconds
    proc = console("-var", "registry_untagged_retention_days=30")
    assert json.loads(proc.stdout.strip()) == "2592000s"
    init = subprocess.run([terraform, "init", "-input=false", "-no-color"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert init.returncode == 0, init.stdout + init.stderr
    for value, ok in (("registry_untagged_retention_days=1", True), ("registry_keep_recent_versions=2", True),
                      ("registry_untagged_retention_days=0", False), ("registry_untagged_retention_days=1.5", False),
                      ("registry_keep_recent_versions=1", False), ("registry_keep_recent_versions=2.5", False)):
        proc = subprocess.run([terraform, "plan", "-input=false", "-no-color", f"-var={value}"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=env)
        assert (proc.returncode == 0) == ok, (value, proc.stdout + proc.stderr)
        assert ok or "Invalid value for variable" in proc.stderr, (value, proc.stderr)


# ---- Cloud Build: its own service account (R10) ----------------------------------------------


@pytest.fixture(scope="module")
def cloudbuild() -> dict:
    return cloudbuild_config()  # its schema and lint: tests/deploy/test_artifacts.py


def test_build_service_account_has_only_what_a_build_needs(cloudbuild):
    res = tf_blocks("resource")
    sa = res[("google_service_account", "build")]
    member = "serviceAccount:${google_service_account.build.email}"
    grants = {key: body for key, body in res.items() if unq(body.get("member", "")) == member}
    roles = {(key[0], unq(body["role"])) for key, body in grants.items()}
    assert roles == {
        ("google_artifact_registry_repository_iam_member", "roles/artifactregistry.writer"),
        ("google_project_iam_member", "roles/logging.logWriter"),
        ("google_storage_bucket_iam_member", "roles/storage.objectViewer"),
    }
    pushes = grants[("google_artifact_registry_repository_iam_member", "build_pushes_images")]
    assert pushes["repository"] == "${google_artifact_registry_repository.images.name}"  # this repository only
    assert grants[("google_storage_bucket_iam_member", "build_reads_sources")]["bucket"] == \
        "${google_storage_bucket.build_sources.name}"
    reads_models = grants[("google_storage_bucket_iam_member", "build_reads_models")]
    assert reads_models["count"] == "${var.cloud_run_model_baked ? 1 : 0}"  # only to bake the model in
    # cloudbuild.yaml runs as it, and logs where such an account can write
    assert cloudbuild["serviceAccount"] == (
        "projects/${PROJECT_ID}/serviceAccounts/${_BUILD_SERVICE_ACCOUNT}@${PROJECT_ID}.iam.gserviceaccount.com")
    assert cloudbuild["substitutions"]["_BUILD_SERVICE_ACCOUNT"] == unq(sa["account_id"])
    assert cloudbuild["options"]["logging"] == "CLOUD_LOGGING_ONLY"
    # the staging bucket cleans itself
    bucket = res[("google_storage_bucket", "build_sources")]
    assert unq(bucket["lifecycle_rule"][0]["action"][0]["type"]) == "Delete"


def test_build_substitutions_output_matches_cloudbuild(cloudbuild):
    value = tf_blocks("output")["build_substitutions"]["value"]
    keys = set(re.findall(r"(_[A-Z_]+)=", value))
    assert keys == {"_REGION", "_REPOSITORY", "_IMAGE", "_TAG", "_BUILD_SERVICE_ACCOUNT"}
    assert keys <= set(cloudbuild["substitutions"])


def bake_script(cloudbuild: dict, bake_model: str) -> str:
    """The bake-model step's script as Cloud Build runs it: substitutions applied, $$ -> $."""
    step = next(s for s in cloudbuild["steps"] if s.get("id") == "bake-model")
    script = step["args"][-1]
    script = script.replace("${_BAKE_MODEL}", bake_model)
    assert not re.search(r"(?<!\$)\$\{?_[A-Z]", script)  # every other $ is escaped for Cloud Build
    return script.replace("$$", "$")


@pytest.mark.parametrize(("bake_model", "expected"), [
    ("", None),
    ("gs://b/qwen/", ["storage", "cp", "gs://b/qwen/*.gguf", "baked-model/"]),
    ("gs://b/qwen", ["storage", "cp", "gs://b/qwen/*.gguf", "baked-model/"]),
    ("gs://b/qwen/model-q4.gguf", ["storage", "cp", "gs://b/qwen/model-q4.gguf", "baked-model/"]),
])
def test_cloudbuild_bakes_the_model_before_the_image_build(tmp_path, cloudbuild, bake_model, expected):
    ids = [s.get("id") for s in cloudbuild["steps"]]
    assert ids.index("bake-model") < ids.index("build")
    calls = fake_bin(tmp_path, {})
    (tmp_path / "baked-model").mkdir()
    proc = subprocess.run(["bash", "-c", bake_script(cloudbuild, bake_model)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded = read_calls(calls)
    assert recorded == ([] if expected is None else [["gcloud", *expected]])


# ---- the Dockerfile (R1, R2, R12, R13) -------------------------------------------------------


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    return dockerfile_parser()  # hadolint on it: tests/deploy/test_artifacts.py


def runtime_stage(parser: DockerfileParser) -> list[dict]:
    froms = [i for i, inst in enumerate(parser.structure) if inst["instruction"] == "FROM"]
    return parser.structure[froms[-1]:]


def test_cuda_base_images_stay_published_and_run_on_cloud_runs_driver(dockerfile):
    args = docker_args(dockerfile)
    # 12.9.1: the last CUDA 12 release (12.2.2's tags go with R535's end of life); a 12.x runs on
    # Cloud Run's R535 L4 driver by minor-version compatibility, with SASS for every target arch
    major, minor, _patch = (int(x) for x in args["CUDA_VERSION"].split("."))
    assert (major, minor) == (12, 9)
    assert args["BUILD_IMAGE"] == "nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04"
    assert args["RUNTIME_IMAGE"] == "nvidia/cuda:${CUDA_VERSION}-base-ubuntu22.04"
    assert "@sha256:" not in (args["BUILD_IMAGE"] + args["RUNTIME_IMAGE"])  # no digest we could not verify
    # only real architectures' machine code is required: every listed arch is plain (SASS + PTX) or -real
    assert all(re.fullmatch(r"\d+(-real)?", a) for a in args["CUDA_ARCHS"].split(";"))


def test_runtime_stage_adds_only_the_cuda_libraries_ggml_links(dockerfile):
    # the build stage lists the runtime packages it linked against: cuBLAS and NCCL, pinned
    build_runs = [i["value"] for i in dockerfile.structure[:dockerfile.structure.index(runtime_stage(dockerfile)[0])]
                  if i["instruction"] == "RUN"]
    listing = next(r for r in build_runs if "dpkg-query" in r)
    assert '"libcublas-${cuda_mm}" libnccl2' in listing and "${Package}=${Version}" in listing
    assert "> /opt/cuda-runtime-packages.txt" in listing
    # the runtime stage installs exactly that list, and nothing of CUDA's other libraries
    final = runtime_stage(dockerfile)
    assert any(i["instruction"] == "COPY" and "--from=build /opt/cuda-runtime-packages.txt" in i["value"]
               for i in final)
    runs = [i["value"] for i in final if i["instruction"] == "RUN"]
    install = next(r for r in runs if "apt-get install" in r)
    assert "xargs apt-get install -y --no-install-recommends < /tmp/cuda-runtime-packages.txt" in install
    assert "cuda-libraries" not in install and "libcufft" not in install
    # the missing-library check: everything but the host's libcuda must resolve
    check = next(r for r in runs if "ldd" in r)
    assert "not found" in check and "libcuda" in check and "exit 1" in check
    # libcublas-MAJOR-MINOR from the devel image's CUDA_VERSION
    m = re.search(r'cuda_mm="\$\((.*?)\)";', listing)
    assert m, listing
    expr = m.group(1).replace("${CUDA_VERSION:?the CUDA image sets CUDA_VERSION}", "${CUDA_VERSION}")
    out = subprocess.run(["bash", "-c", f"echo $({expr})"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "CUDA_VERSION": "12.9.1"})
    assert out.stdout.strip() == "12-9"


def test_compile_jobs_are_bounded(dockerfile, cloudbuild):
    args = docker_args(dockerfile)
    jobs = int(args["BUILD_JOBS"])
    assert 1 <= jobs <= 16
    runs = " ".join(i["value"] for i in dockerfile.structure if i["instruction"] == "RUN")
    assert 'BUILD_JOBS="${BUILD_JOBS}"' in runs  # scripts/build-llama-wheel.sh's CMake parallelism
    assert 'CMAKE_BUILD_PARALLEL_LEVEL="$jobs"' in (ROOT / "scripts" / "build-llama-wheel.sh").read_text()
    assert cloudbuild["substitutions"]["_BUILD_JOBS"] == str(jobs)
    build = next(s for s in cloudbuild["steps"] if s.get("id") == "build")
    assert "--build-arg=BUILD_JOBS=${_BUILD_JOBS}" in build["args"]


def test_uid_1000_is_app_on_any_base(dockerfile):
    final = runtime_stage(dockerfile)
    run = next(i["value"] for i in final if i["instruction"] == "RUN" and "useradd" in i["value"])
    assert run.index("userdel") < run.index("useradd --uid 1000")
    assert [i["value"] for i in final if i["instruction"] == "USER"][-1] == "1000"


def test_baked_model_reaches_the_image(dockerfile):
    final = runtime_stage(dockerfile)
    assert any(i["instruction"] == "COPY" and i["value"].endswith("baked-model/ /opt/model/") for i in final)
    assert "!baked-model/" in (ROOT / ".dockerignore").read_text()
    assert (ROOT / "baked-model" / "README.md").is_file()


# ---- .gcloudignore: what gcloud builds submit uploads -----------------------------------------


def test_gcloudignore_uploads_only_the_build_context(tmp_path):
    text = (ROOT / ".gcloudignore").read_text()
    assert text.splitlines()[4] == "*"
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("gcloud not installed: the listing needs its own .gcloudignore parser")
    # a copy of the build's inputs plus what must never be uploaded
    for name in ("Dockerfile", ".dockerignore", ".gcloudignore", "pyproject.toml", "README.md", "cloudbuild.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "baked-model", tmp_path / "baked-model")
    shutil.copytree(ROOT / "wheels", tmp_path / "wheels")
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copytree(ROOT / "requirements", tmp_path / "requirements")
    for junk in ("requirements/dev.txt", ".venv/lib/x.py", "models/big.gguf", "baked-model/big.gguf", "tests/test_x.py",
                 "wheels/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl",
                 "bench/RESULTS.md", "terraform/terraform.tfstate", "app/__pycache__/x.pyc"):
        (tmp_path / junk).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / junk).write_text("x")
    proc = subprocess.run([gcloud, "meta", "list-files-for-upload"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = set(proc.stdout.split())
    expected = {"Dockerfile", ".dockerignore", "requirements/image.lock", "pyproject.toml", "README.md",
                "baked-model/README.md", "baked-model/.gitignore", "wheels/README.md", "wheels/.gitignore",
                "scripts/build-llama-wheel.sh"}
    apps = {p for p in listed if p.startswith("app/")}
    assert listed == expected | apps
    assert apps == {str(p.relative_to(tmp_path)) for p in (tmp_path / "app").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts}


# ---- scripts/deploy.sh: the bootstrap from an empty project (D5) ------------------------------


def test_shellcheck_deploy_script():
    proc = subprocess.run([tool("shellcheck"), str(DEPLOY)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_deploy_script_expands_arrays_safely_for_bash_3_2():
    """bash < 4.4 treats "${a[@]}" of an empty array as unbound under set -u: every expansion is guarded."""
    text = DEPLOY.read_text()
    for m in re.finditer(r'"\$\{(\w+)\[@\]\}"', text):
        before = text[max(0, m.start() - len(m.group(1)) - 8):m.start()]
        assert before.endswith(f"${{{m.group(1)}[@]+"), text[m.start() - 40:m.end()]


OUTPUTS = {
    "build_project": "my-project",
    "build_service_account": "vertex-gguf-build@my-project.iam.gserviceaccount.com",
    "build_source_staging_dir": "gs://my-project-vertex-gguf-build/source",
    "build_substitutions": "_REGION=us-central1,_REPOSITORY=vertex-gguf,_IMAGE=vertex-gguf,_TAG=v1,"
                           "_BUILD_SERVICE_ACCOUNT=vertex-gguf-build",
    "model_uri": "gs://my-models/qwen/",
}


def fake_bin(tmp_path: Path, outputs: dict[str, str], model_present: bool = True) -> Path:
    """Fake gcloud and terraform that append their argv (one JSON list a line) to calls.jsonl."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.jsonl"
    recorder = (
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"calls = {str(calls)!r}\n"
        "name = os.path.basename(sys.argv[0])\n"
        "args = sys.argv[1:]\n"
        "with open(calls, 'a') as f:\n"
        "    f.write(json.dumps([name, *args]) + '\\n')\n"
    )
    (bindir / "terraform").write_text(recorder + (
        f"outputs = {outputs!r}\n"
        "args = [a for a in args if not a.startswith('-chdir=')]\n"
        "if args[:2] == ['output', '-raw']:\n"
        "    if args[2] not in outputs:\n"
        "        sys.exit('no output ' + args[2])\n"
        "    sys.stdout.write(outputs[args[2]])\n"
    ))
    (bindir / "gcloud").write_text(recorder + (
        f"present = {model_present!r}\n"
        "if args[:2] == ['storage', 'ls']:\n"
        "    if not present:\n"
        "        sys.exit(1)\n"
        "    print(args[2].rstrip('/') + '/qwen2.5-7b-instruct-q4_k_m.gguf')\n"
    ))
    for f in bindir.iterdir():
        f.chmod(0o755)
    return calls


def read_calls(calls: Path) -> list[list[str]]:
    if not calls.exists():
        return []
    return [json.loads(line) for line in calls.read_text().splitlines()]


def run_deploy(tmp_path: Path, *args: str, model_present: bool = True) -> tuple[subprocess.CompletedProcess, list]:
    calls = fake_bin(tmp_path, OUTPUTS, model_present)
    tf_dir = tmp_path / "tf"
    tf_dir.mkdir(exist_ok=True)
    (tf_dir / "terraform.tfvars").write_text('project_id = "my-project"\n')
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "TF_DIR": str(tf_dir)}
    proc = subprocess.run(["bash", str(DEPLOY), *args], capture_output=True, text=True, timeout=120, env=env)
    return proc, read_calls(calls)


def terraform_verbs(calls: list[list[str]]) -> list[str]:
    out = []
    for c in calls:
        args = [a for a in c[1:] if not a.startswith("-chdir=")]
        if c[0] == "terraform":
            kind = args[0]
            if kind == "apply":
                kind += " targeted" if any(a.startswith("-target=") for a in args) else " full"
            elif kind == "output" and len(args) > 2:
                kind += " " + args[2]
            out.append("terraform " + kind)
        else:
            out.append("gcloud " + " ".join(args[:2]))
    return out


FOUNDATION_TYPES_FORBIDDEN = ("google_cloud_run_v2_service", "google_vertex_ai_endpoint", "terraform_data")


def test_deploy_from_an_empty_project_runs_in_order(tmp_path):
    model = tmp_path / "qwen2.5-7b-instruct-q4_k_m.gguf"
    model.write_bytes(b"GGUF")
    proc, calls = run_deploy(tmp_path, "--model", str(model), "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verbs = terraform_verbs(calls)
    assert verbs == [
        "terraform init",
        "terraform apply targeted",
        "terraform output build_project",
        "terraform output build_service_account",
        "terraform output build_source_staging_dir",
        "terraform output build_substitutions",
        "terraform output model_uri",
        "gcloud storage cp",
        "gcloud storage ls",
        "gcloud builds submit",
        "terraform apply full",
        "terraform output",
    ]
    by_verb = dict(zip(verbs, calls, strict=True))
    # 1. the foundations: real resources, all of them, and nothing that deploys
    targets = [a.removeprefix("-target=") for a in by_verb["terraform apply targeted"] if a.startswith("-target=")]
    resources = {f"{t}.{n}" for t, n in tf_blocks("resource")}
    assert set(targets) <= resources, set(targets) - resources
    for needed in ("google_project_service.apis", "google_artifact_registry_repository.images",
                   "google_storage_bucket.models", "google_service_account.build",
                   "google_artifact_registry_repository_iam_member.build_pushes_images"):
        assert needed in targets
    assert not [t for t in targets if t.startswith(FOUNDATION_TYPES_FORBIDDEN)]
    assert "-auto-approve" in by_verb["terraform apply targeted"]
    # 2. the model, into the model directory, never overwriting
    assert by_verb["gcloud storage cp"][1:] == ["storage", "cp", "--no-clobber", str(model), "gs://my-models/qwen/"]
    # 3. the build, as the build service account, from the repository root
    submit = by_verb["gcloud builds submit"]
    assert submit[3] == str(ROOT)
    assert f"--config={ROOT / 'cloudbuild.yaml'}" in submit
    assert "--project=my-project" in submit
    assert f"--service-account=projects/my-project/serviceAccounts/{OUTPUTS['build_service_account']}" in submit
    assert f"--gcs-source-staging-dir={OUTPUTS['build_source_staging_dir']}" in submit
    assert f"--substitutions={OUTPUTS['build_substitutions']}" in submit
    # nothing created twice: the repository and the APIs are Terraform's alone
    flat = [" ".join(c) for c in calls]
    assert not [c for c in flat if "repositories create" in c or "services enable" in c]


def test_deploy_stops_before_building_when_the_bucket_holds_no_model(tmp_path):
    proc, calls = run_deploy(tmp_path, "--yes", model_present=False)
    assert proc.returncode != 0
    assert "no GGUF at gs://my-models/qwen/" in proc.stderr
    verbs = terraform_verbs(calls)
    assert "gcloud builds submit" not in verbs and "terraform apply full" not in verbs


def test_redeploy_without_a_build(tmp_path):
    proc, calls = run_deploy(tmp_path, "--skip-build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verbs = terraform_verbs(calls)
    assert "gcloud builds submit" not in verbs and "gcloud storage cp" not in verbs
    assert verbs.index("terraform apply targeted") < verbs.index("gcloud storage ls") < verbs.index(
        "terraform apply full")
    assert not [c for c in calls if "-auto-approve" in c]  # without --yes, terraform asks


def test_deploy_with_a_baked_model_and_extra_terraform_arguments(tmp_path):
    proc, calls = run_deploy(tmp_path, "--bake", "--yes", "--", "-var-file=prod.tfvars")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_verb = dict(zip(terraform_verbs(calls), calls, strict=True))
    for apply in ("terraform apply targeted", "terraform apply full"):
        assert "-var=cloud_run_model_baked=true" in by_verb[apply]
        assert "-var-file=prod.tfvars" in by_verb[apply]
    assert f"--substitutions={OUTPUTS['build_substitutions']},_BAKE_MODEL=gs://my-models/qwen/" in \
        by_verb["gcloud builds submit"]


def test_deploy_uploads_a_folder_of_shards(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in (1, 2):
        (shards / f"m-0000{i}-of-00002.gguf").write_bytes(b"GGUF")
    proc, calls = run_deploy(tmp_path, "--model", str(shards), "--skip-build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cp = next(c for c in calls if c[1:3] == ["storage", "cp"])
    assert cp[3:] == ["--no-clobber", str(shards / "m-00001-of-00002.gguf"), str(shards / "m-00002-of-00002.gguf"),
                      "gs://my-models/qwen/"]


def test_outputs_the_script_reads_survive_the_targeted_apply():
    """After `apply -target`, Terraform updates only outputs derived from targeted resources."""
    text = DEPLOY.read_text()
    foundations = set(re.search(r'FOUNDATIONS="(.*?)"', text, re.S).group(1).split())
    read = re.findall(r"tf output -raw (\w+)", text)
    assert read
    outputs = tf_blocks("output")
    loc = tf_locals()
    for name in read:
        value = outputs[name]["value"]
        for local in re.findall(r"local\.(\w+)", value):  # one level of locals
            value += " " + loc[local]
        refs = set(re.findall(r"\b(google_\w+\.\w+)\.", value))
        assert refs, f"output {name} refers to no resource: a targeted apply would not update it"
        assert refs <= foundations, (name, refs - foundations)
