"""Resumable streams in the deploy artifacts, checked offline (issue 14).

Terraform is parsed with python-hcl2 and asserted; the expressions that decide what is created
and what each platform's STREAM_STORE is are run through a real `terraform console` / `plan` on a
provider-free copy: variables.tf, streams_rules.tf and vertex_rules.tf as they are, plus the
locals blocks of main.tf, vertex.tf and streams.tf with their few resource references stubbed
(the Memorystore instance's host and port, the bucket name, the runtime account), and the
for_each expressions of the APIs and the Cloud Run blocks copied out of the parsed files. So a
changed expression in the real files changes what these tests evaluate.

`terraform validate` of the whole configuration needs the google provider, which cannot be
downloaded here (no registry): it runs when a local provider directory is given in
TF_GOOGLE_PROVIDER_DIR (a `terraform providers mirror` of hashicorp/google), and is skipped
otherwise; the provider-free part is validated always.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.deploy_files import TF, terraform, tf_blocks, tf_locals, unq

REQUIRED = ["-var", "project_id=p", "-var", "model_bucket=b", "-var", "model_path=m/"]
ENV = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
STUB_HOST, STUB_PORT = "10.20.30.4", 6378  # what the fake Memorystore instance answers


def resources() -> dict:
    return tf_blocks("resource")


def cloud_run_template() -> dict:
    return resources()[("google_cloud_run_v2_service", "llm")]["template"][0]


def dynamic_blocks(body: dict, kind: str) -> list[dict]:
    """The `dynamic "<kind>"` blocks of a parsed block body."""
    return [b[f'"{kind}"'] for b in body.get("dynamic", []) if f'"{kind}"' in b]


def stream_store_env_block() -> dict:
    envs = dynamic_blocks(cloud_run_template()["containers"][0], "env")
    found = [e for e in envs if "cloud_run_stream_store" in e["for_each"]]
    assert len(found) == 1, envs
    return found[0]


def inner(expr: str) -> str:
    """python-hcl2 wraps an expression as ${...}: the expression itself."""
    assert expr.startswith("${") and expr.endswith("}"), expr
    return expr[2:-1]


def variable_block(path: Path, name: str) -> str:
    m = re.search(rf'^variable "{name}" \{{\n.*?^\}}\n', path.read_text(), re.M | re.S)
    assert m, name
    return m.group(0)


def locals_block(path: Path, marker: str) -> str:
    """The raw text of the `locals {` block that contains ``marker`` (ends at a `}` in column 0)."""
    text = path.read_text()
    for m in re.finditer(r"^locals \{\n.*?^\}\n", text, re.M | re.S):
        if marker in m.group(0):
            return m.group(0)
    raise AssertionError(f"no locals block with {marker} in {path.name}")


# ---- Terraform, parsed ---------------------------------------------------------------------


def test_redis_is_off_by_default_and_everything_hangs_on_it():
    variables = tf_blocks("variable")
    assert variables["stream_store_redis"]["default"] is False
    assert variables["stream_store_url"]["default"] is None and variables["stream_store_url"]["sensitive"] is True
    assert variables["stream_store_url_on_vpc"]["default"] is False
    assert variables["vertex_stream_store"]["default"] is None
    assert variables["cloud_run_session_affinity"]["default"] is False
    for name in ("stream_buffer_bytes", "stream_session_ttl_seconds"):
        assert variables[name]["default"] is None  # the server's own defaults
    redis = resources()[("google_redis_instance", "streams")]
    assert redis["count"] == "${var.stream_store_redis ? 1 : 0}"
    vpc = dynamic_blocks(cloud_run_template(), "vpc_access")
    assert len(vpc) == 1 and vpc[0]["for_each"] == "${local.cloud_run_vpc_egress ? [1] : []}"
    assert stream_store_env_block()["for_each"] == '${local.cloud_run_stream_store_set ? ["STREAM_STORE"] : []}'
    assert tf_locals(["streams_rules.tf"])["cloud_run_vpc_egress"] == (
        "${var.stream_store_redis || var.stream_store_url_on_vpc}")


def test_memorystore_instance_follows_the_variables():
    redis = resources()[("google_redis_instance", "streams")]
    assert redis["tier"] == "${var.stream_store_redis_tier}"
    assert redis["memory_size_gb"] == "${var.stream_store_redis_memory_size_gb}"
    assert redis["redis_version"] == "${var.stream_store_redis_version}"
    assert redis["authorized_network"] == "${local.stream_store_network_id}"
    assert redis["region"] == "${local.cloud_run_region}"  # beside the service that uses it
    assert unq(redis["connect_mode"]) == "DIRECT_PEERING"
    assert redis["deletion_protection"] is False  # provider 7.8+ would refuse to remove it
    assert "${google_project_service.apis}" in redis["depends_on"]
    # the provider version that knows deletion_protection
    text = (TF / "versions.tf").read_text()
    assert re.search(r'version\s*=\s*">= 7\.(8|9|[1-9][0-9])\b', text), text
    # justified checkov suppressions, not silent ones
    comments = " ".join(c["value"] for c in redis["__comments__"])
    for check in ("CKV_GCP_95", "CKV_GCP_97"):
        assert re.search(rf"checkov:skip={check}:\S", comments), check


def test_cloud_run_vpc_egress_env_and_affinity():
    tmpl = cloud_run_template()
    assert tmpl["session_affinity"] == "${var.cloud_run_session_affinity}"
    content = dynamic_blocks(tmpl, "vpc_access")[0]["content"][0]
    assert unq(content["egress"]) == "PRIVATE_RANGES_ONLY"  # Cloud Storage and Google APIs unchanged
    nic = content["network_interfaces"][0]
    assert nic == {"network": "${var.stream_store_network}", "subnetwork": "${var.stream_store_subnetwork}",
                   "__is_block__": True}
    env = stream_store_env_block()["content"][0]
    assert env["name"] == "${env.value}"
    assert env["value"] == "${local.cloud_run_stream_store}"
    # the instance's address, not a literal
    expr = tf_locals(["streams.tf"], unquote=False)["cloud_run_stream_store"]
    assert "google_redis_instance.streams[*].host" in expr and "google_redis_instance.streams[*].port" in expr
    assert "var.stream_store_url" in expr


def test_vertex_gets_stream_store_only_from_its_own_variable():
    env = tf_locals(["vertex.tf"], unquote=False)["vertex_env"]
    assert "var.vertex_stream_store == null ? {} : {STREAM_STORE = var.vertex_stream_store}" in env
    # never the Memorystore instance (unreachable from a Vertex endpoint) nor the Cloud Run URL
    assert "google_redis_instance" not in env and "stream_store_url" not in env
    assert "cloud_run_stream_store" not in (TF / "vertex.tf").read_text()


def test_outputs_name_the_instance():
    out = tf_blocks("output")
    assert out["stream_store_redis_host"]["value"] == "${one(google_redis_instance.streams[*].host)}"
    assert out["stream_store_redis_port"]["value"] == "${one(google_redis_instance.streams[*].port)}"


def test_every_stream_env_name_is_a_server_setting_with_the_same_bounds():
    from app.settings import Settings

    fields = Settings.model_fields
    aliases = {}
    for name, info in fields.items():
        alias = info.validation_alias
        for choice in getattr(alias, "choices", [alias] if isinstance(alias, str) else []):
            aliases[str(choice).upper()] = name
    tuning = tf_locals(["streams_rules.tf"], unquote=False)["stream_tuning_env"]
    names = {"STREAM_STORE", *re.findall(r"\b(STREAM_[A-Z_]+) = ", tuning)}
    assert names == {"STREAM_STORE", "STREAM_BUFFER_BYTES", "STREAM_SESSION_TTL"}
    assert names <= aliases.keys(), names - aliases.keys()

    def bounds(field: str) -> dict:
        out = {}
        for m in fields[aliases[field]].metadata:
            for key in ("ge", "gt", "le", "lt", "pattern"):
                if getattr(m, key, None) is not None:
                    out[key] = getattr(m, key)
        return out

    variables = tf_blocks("variable")
    buffer = bounds("STREAM_BUFFER_BYTES")
    cond = variables["stream_buffer_bytes"]["validation"][0]["condition"]
    assert f">= {buffer['ge']}" in cond and f"<= {buffer['le']}" in cond
    ttl = bounds("STREAM_SESSION_TTL")
    cond = variables["stream_session_ttl_seconds"]["validation"][0]["condition"]
    assert f"<= {int(ttl['le'])}" in cond and ttl.get("gt", 0) < 1  # Terraform asks for whole seconds >= 1
    pattern = bounds("STREAM_STORE")["pattern"]
    for url in (f"redis://{STUB_HOST}:{STUB_PORT}/0", "rediss://:pw@redis.example.com:6380/0", "memory"):
        assert re.fullmatch(pattern, url), (pattern, url)


def test_tfvars_example_shows_the_stream_variables():
    example = (TF / "terraform.tfvars.example").read_text()
    for name in ("stream_store_redis", "stream_store_redis_tier", "stream_store_url", "vertex_stream_store",
                 "cloud_run_session_affinity"):
        assert re.search(rf"^#?\s*{name}\s*=", example, re.M), name


# ---- Terraform run offline: what gets created, what each platform's STREAM_STORE is ----------


@pytest.fixture(scope="module")
def streams_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("streams")
    for name in ("variables.tf", "streams_rules.tf", "vertex_rules.tf"):
        shutil.copy(TF / name, d / name)
    (d / "cloud_run_variables.tf").write_text(variable_block(TF / "cloud_run.tf", "api_key_secret"))
    main = locals_block(TF / "main.tf", "server_env").replace("google_storage_bucket.models.name", '"b"')
    vertex = locals_block(TF / "vertex.tf", "vertex_env").replace(
        "google_service_account.runtime.email", "local.stub_sa")
    streams = locals_block(TF / "streams.tf", "cloud_run_stream_store").replace(
        "google_redis_instance.streams[*]", "local.stub_redis[*]")
    res = resources()
    content = stream_store_env_block()
    exprs = {
        "apis": res[("google_project_service", "apis")]["for_each"],
        "redis_count": res[("google_redis_instance", "streams")]["count"],
        "vpc_access_for_each": dynamic_blocks(cloud_run_template(), "vpc_access")[0]["for_each"],
        "stream_env_for_each": content["for_each"],
    }
    stubs = "\n".join(f"  {k} = {inner(v)}" for k, v in exprs.items())
    (d / "stubs.tf").write_text(
        main + vertex + streams + "locals {\n"
        '  cloud_run_region = var.region\n'
        '  image_by_digest  = "r-docker.pkg.dev/p/vertex-gguf/vertex-gguf@sha256:abc"\n'
        '  stub_sa          = "vertex-gguf-runtime@p.iam.gserviceaccount.com"\n'
        f'  stub_redis       = var.stream_store_redis ? [{{ host = "{STUB_HOST}", port = {STUB_PORT} }}] : []\n'
        f"{stubs}\n}}\n")
    init = subprocess.run([terraform(), "init", "-input=false", "-no-color"], cwd=d, capture_output=True,
                          text=True, timeout=120, env=ENV)
    assert init.returncode == 0, init.stdout + init.stderr
    return d


def console(d: Path, expr: str, *args: str):
    proc = subprocess.run([terraform(), "console", *REQUIRED, *args], cwd=d, input=f"jsonencode({expr})",
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0 and "Error" not in proc.stderr, proc.stderr
    return json.loads(json.loads(proc.stdout.strip().splitlines()[-1]))


def plan(d: Path, *args: str) -> tuple[bool, str]:
    proc = subprocess.run([terraform(), "plan", "-input=false", "-lock=false", "-no-color", *REQUIRED, *args],
                          cwd=d, capture_output=True, text=True, timeout=120, env=ENV)
    return proc.returncode == 0, re.sub(r"\s+", " ", proc.stdout + proc.stderr)


def test_defaults_create_nothing_and_change_no_env(streams_dir):
    assert console(streams_dir, "local.redis_count") == 0
    assert console(streams_dir, "local.vpc_access_for_each") == []
    assert console(streams_dir, "local.stream_env_for_each") == []
    apis = console(streams_dir, "local.apis")
    assert "redis.googleapis.com" not in apis and "compute.googleapis.com" not in apis
    assert "run.googleapis.com" in apis
    assert console(streams_dir, "nonsensitive(local.cloud_run_stream_store)") is None
    assert console(streams_dir, "local.stream_tuning_env") == {}
    env = console(streams_dir, "local.vertex_env")
    assert not any(k.startswith("STREAM_") for k in env), env
    ok, text = plan(streams_dir)
    assert ok and "stream_rules" not in text, text[-2000:]  # not even the rules' terraform_data


def test_redis_on_creates_the_instance_and_points_cloud_run_at_it(streams_dir):
    on = ["-var", "stream_store_redis=true", "-var", "stream_store_redis_tier=STANDARD_HA"]
    assert console(streams_dir, "local.redis_count", *on) == 1
    assert console(streams_dir, "local.vpc_access_for_each", *on) == [1]
    assert console(streams_dir, "local.stream_env_for_each", *on) == ["STREAM_STORE"]
    assert console(streams_dir, "nonsensitive(local.cloud_run_stream_store)", *on) == (
        f"redis://{STUB_HOST}:{STUB_PORT}/0")
    apis = console(streams_dir, "local.apis", *on)
    assert {"redis.googleapis.com", "compute.googleapis.com"} <= set(apis)
    assert console(streams_dir, "local.stream_store_network_id", *on) == "projects/p/global/networks/default"
    assert console(streams_dir, "local.stream_store_network_id", *on, "-var", "stream_store_network=llm-vpc") == (
        "projects/p/global/networks/llm-vpc")
    # Vertex is untouched by the instance
    assert "STREAM_STORE" not in console(streams_dir, "local.vertex_env", *on)
    ok, text = plan(streams_dir, *on)
    assert ok and "terraform_data.stream_rules[0] will be created" in text, text[-2000:]


def test_existing_redis_url_for_cloud_run(streams_dir):
    url = ["-var", "stream_store_url=redis://10.9.8.7:6379/2"]
    assert console(streams_dir, "local.redis_count", *url) == 0
    assert console(streams_dir, "nonsensitive(local.cloud_run_stream_store)", *url) == "redis://10.9.8.7:6379/2"
    assert console(streams_dir, "local.stream_env_for_each", *url) == ["STREAM_STORE"]
    assert console(streams_dir, "local.vpc_access_for_each", *url) == []  # a public Redis: no VPC
    on_vpc = [*url, "-var", "stream_store_url_on_vpc=true"]
    assert console(streams_dir, "local.vpc_access_for_each", *on_vpc) == [1]
    assert "compute.googleapis.com" in console(streams_dir, "local.apis", *on_vpc)
    assert "redis.googleapis.com" not in console(streams_dir, "local.apis", *on_vpc)


def test_vertex_upload_body_carries_stream_store_and_tuning(streams_dir):
    args = ["-var", "vertex_stream_store=rediss://:pw@redis.example.com:6380/0",
            "-var", "stream_buffer_bytes=1048576", "-var", "stream_session_ttl_seconds=600"]
    upload = json.loads(console(streams_dir, "local.vertex_upload_body", *args))
    env = {e["name"]: e["value"] for e in upload["model"]["containerSpec"]["env"]}
    assert env["STREAM_STORE"] == "rediss://:pw@redis.example.com:6380/0"
    assert env["STREAM_BUFFER_BYTES"] == "1048576" and env["STREAM_SESSION_TTL"] == "600"
    assert env["REQUEST_TIMEOUT"] == "590" and env["MODEL"] == "gs://b/m/"
    # the tuning reaches Cloud Run too (server_env), and Cloud Run's store stays its own
    server_env = console(streams_dir, "local.server_env", *args)
    assert server_env["STREAM_BUFFER_BYTES"] == "1048576" and "STREAM_STORE" not in server_env
    # without the variable the body has no STREAM_STORE (memory)
    upload = json.loads(console(streams_dir, "local.vertex_upload_body"))
    assert "STREAM_STORE" not in {e["name"] for e in upload["model"]["containerSpec"]["env"]}
    ok, text = plan(streams_dir, *args)
    assert ok, text[-2000:]


def test_vertex_invoke_routes_replace_the_predict_route(streams_dir):
    """The invoke method (GET/DELETE /v1/stream on Vertex need it): invokeRoutePrefix "/*" and no predictRoute."""
    spec = json.loads(console(streams_dir, "local.vertex_upload_body", "-var", "vertex_invoke_routes=true"))
    spec = spec["model"]["containerSpec"]
    assert spec["invokeRoutePrefix"] == "/*" and "predictRoute" not in spec  # the API takes one of the two
    assert spec["healthRoute"] == "/health"
    spec = json.loads(console(streams_dir, "local.vertex_upload_body"))["model"]["containerSpec"]
    assert spec["predictRoute"] == "/predict" and "invokeRoutePrefix" not in spec
    ok, text = plan(streams_dir, "-var", "vertex_invoke_routes=true", "-var", "vertex_dedicated_endpoint=false")
    assert not ok and "Vertex AI deploys an invoke-enabled Model to a dedicated endpoint only" in text, text[-2000:]
    ok, text = plan(streams_dir, "-var", "vertex_invoke_routes=true")
    assert ok, text[-2000:]
    out = tf_blocks("output")
    assert out["vertex_invoke_url"]["value"] == (
        "${var.deploy_vertex && var.vertex_invoke_routes ? "
        '"https://${local.vertex_host}/v1/${local.vertex_endpoint_path}/invoke" : null}')
    for name in ("vertex_predict_url", "vertex_raw_predict_url", "vertex_stream_raw_predict_url",
                 "vertex_openai_base_url"):
        assert out[name]["value"].startswith("${var.deploy_vertex && !var.vertex_invoke_routes ? "), name


@pytest.mark.parametrize("args, ok, message", [
    (["-var", "stream_store_redis_tier=STANDARD_HA", "-var", "stream_store_redis=true"], True, ""),
    (["-var", "stream_store_redis_tier=STANDARD"], False, "must be BASIC or STANDARD_HA"),
    (["-var", "stream_store_redis_memory_size_gb=300"], True, ""),
    (["-var", "stream_store_redis_memory_size_gb=0"], False, "whole number of GiB from 1 to 300"),
    (["-var", "stream_store_redis_memory_size_gb=301"], False, "whole number of GiB from 1 to 300"),
    (["-var", "stream_store_redis_memory_size_gb=1.5"], False, "whole number of GiB from 1 to 300"),
    (["-var", "stream_store_redis_version=REDIS_6_X"], True, ""),
    (["-var", "stream_store_redis_version=7.2"], False, "Memorystore redisVersion"),
    (["-var", "stream_store_network=llm-vpc", "-var", "stream_store_subnetwork=run-us-central1"], True, ""),
    (["-var", "stream_store_network=My_Net"], False, "stream_store_network is the name of a VPC network"),
    (["-var", "stream_store_network=projects/host/global/networks/shared"], False,
     "stream_store_network is the name of a VPC network"),
    (["-var", "stream_store_subnetwork=a/b"], False, "stream_store_subnetwork is the name of a subnetwork"),
    (["-var", "stream_store_url=rediss://:secret@10.0.0.5:6378/0"], True, ""),
    (["-var", "stream_store_url=memcached://10.0.0.5:11211"], False, "redis:// or rediss:// URL"),
    (["-var", "stream_store_url=redis://a b"], False, "redis:// or rediss:// URL"),
    (["-var", "vertex_stream_store=memory"], True, ""),
    (["-var", "vertex_stream_store=http://redis.example.com"], False, "must be null, memory, or a redis://"),
    (["-var", "stream_buffer_bytes=256"], True, ""),
    (["-var", "stream_buffer_bytes=255"], False, "from 256 to 268435456"),
    (["-var", "stream_buffer_bytes=268435457"], False, "from 256 to 268435456"),
    (["-var", "stream_session_ttl_seconds=0"], False, "from 1 to 604800"),
    (["-var", "stream_session_ttl_seconds=604801"], False, "from 1 to 604800"),
    (["-var", "stream_session_ttl_seconds=30.5"], False, "from 1 to 604800"),
    # between variables (the preconditions of terraform_data.stream_rules)
    (["-var", "stream_store_redis=true", "-var", "stream_store_url=redis://10.0.0.5:6379/0"], False,
     "not both"),
    (["-var", "stream_store_url_on_vpc=true"], False, "set stream_store_url too"),
    (["-var", "stream_store_redis=true", "-var", "deploy_cloud_run=false"], False,
     "configure the Cloud Run service only"),
    (["-var", "stream_store_url=redis://10.0.0.5:6379/0", "-var", "deploy_cloud_run=false"], False,
     "configure the Cloud Run service only"),
    (["-var", "vertex_stream_store=rediss://:pw@10.1.2.3:6379/0"], False, "points at a private address (10.1.2.3)"),
    (["-var", "vertex_stream_store=redis://172.20.0.9:6379/0"], False, "points at a private address"),
    (["-var", "vertex_stream_store=redis://192.168.1.1"], False, "points at a private address"),
    (["-var", "vertex_stream_store=rediss://:pw@172.32.0.9:6379/0"], True, ""),  # public, despite 172.
    (["-var", "vertex_stream_store=rediss://:pw@redis.example.com:6380/0", "-var", "deploy_cloud_run=false"],
     True, ""),
])
def test_validations_fail_at_plan_time(streams_dir, args, ok, message):
    passed, text = plan(streams_dir, *args)
    assert passed == ok, text[-3000:]
    assert message in text, text[-3000:]


def test_plain_redis_for_vertex_is_a_warning(streams_dir):
    ok, text = plan(streams_dir, "-var", "vertex_stream_store=redis://:pw@redis.example.com:6379/0")
    assert ok and "Warning: Check block assertion failed" in text and "Prefer rediss://" in text, text[-2000:]
    ok, text = plan(streams_dir, "-var", "vertex_stream_store=rediss://:pw@redis.example.com:6380/0")
    assert ok and "Check block assertion failed" not in text, text[-2000:]


# ---- terraform validate, fmt --------------------------------------------------------------------


def test_provider_free_part_validates(streams_dir):
    proc = subprocess.run([terraform(), "validate", "-no-color"], cwd=streams_dir, capture_output=True,
                          text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_terraform_fmt_clean():
    proc = subprocess.run([terraform(), "fmt", "-check", "-diff", "-recursive"], cwd=TF, capture_output=True,
                          text=True, timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_whole_configuration_validates_with_a_local_google_provider(tmp_path):
    plugins = os.environ.get("TF_GOOGLE_PROVIDER_DIR")
    if not plugins:
        pytest.skip("TF_GOOGLE_PROVIDER_DIR not set: the google provider cannot be downloaded offline "
                    "(make one with `terraform -chdir=terraform providers mirror DIR` where the registry is reachable)")
    d = tmp_path / "terraform"
    shutil.copytree(TF, d, ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", "terraform.tfvars"))
    init = subprocess.run([terraform(), "init", "-backend=false", "-input=false", "-no-color",
                           f"-plugin-dir={plugins}"], cwd=d, capture_output=True, text=True, timeout=300, env=ENV)
    assert init.returncode == 0, init.stdout + init.stderr
    proc = subprocess.run([terraform(), "validate", "-no-color"], cwd=d, capture_output=True, text=True,
                          timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
