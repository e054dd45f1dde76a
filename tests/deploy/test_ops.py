"""The deploy artifacts' side of operations: JSON logs on both platforms, and Cloud Run's API key
from Secret Manager (offline: the Terraform as python-hcl2 parses it)."""

from __future__ import annotations

import re

from tests.support.deploy_files import tf_blocks, tf_locals, unq


def test_both_platforms_log_json_with_the_project():
    server_env = tf_locals(["main.tf"])["server_env"]
    assert re.search(r'LOG_FORMAT = "json"', server_env), server_env
    assert "GOOGLE_CLOUD_PROJECT = var.project_id" in server_env
    # Cloud Run takes every server_env entry; Vertex merges it into its own
    resources = tf_blocks("resource")
    dynamic = resources[("google_cloud_run_v2_service", "llm")]["template"][0]["containers"][0]["dynamic"]
    fors = [body["for_each"] for block in dynamic for body in block.values()]
    assert "${local.server_env}" in fors
    assert tf_locals(["vertex.tf"])["vertex_env"].startswith("${merge(local.server_env")


def test_cloud_run_reads_the_api_key_from_secret_manager():
    variables = tf_blocks("variable")
    assert variables["api_key_secret"]["default"] is None
    assert unq(variables["api_key_secret_version"]["default"]) == "latest"
    resources = tf_blocks("resource")
    containers = resources[("google_cloud_run_v2_service", "llm")]["template"][0]["containers"][0]
    envs = [body for block in containers["dynamic"] for body in block.values()]
    keyed = [e for e in envs if "api_key_secret" in e["for_each"]]
    assert len(keyed) == 1
    assert keyed[0]["for_each"] == "${var.api_key_secret == null ? [] : [var.api_key_secret]}"
    content = keyed[0]["content"][0]
    assert unq(content["name"]) == "API_KEY" and "value" not in content  # never a literal
    ref = content["value_source"][0]["secret_key_ref"][0]
    assert ref["secret"] == "${env.value}" and ref["version"] == "${var.api_key_secret_version}"
    # the runtime account (and only it) may read that one secret, when there is one
    grant = resources[("google_secret_manager_secret_iam_member", "runtime_reads_api_key")]
    assert grant["count"] == "${var.deploy_cloud_run && var.api_key_secret != null ? 1 : 0}"
    assert unq(grant["role"]) == "roles/secretmanager.secretAccessor"
    assert unq(grant["member"]) == "serviceAccount:${google_service_account.runtime.email}"
    assert grant["secret_id"] == "${var.api_key_secret}"
    depends = resources[("google_cloud_run_v2_service", "llm")]["depends_on"]
    assert "${google_secret_manager_secret_iam_member.runtime_reads_api_key}" in depends
    # Secret Manager's API is enabled only when a secret is used
    apis = resources[("google_project_service", "apis")]["for_each"]
    assert 'var.api_key_secret == null ? [] : ["secretmanager.googleapis.com"]' in apis
