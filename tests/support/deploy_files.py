"""What the offline deploy checks share: the repository's paths, the tools they run, and the
deploy artifacts parsed (Terraform with python-hcl2, the Dockerfile, cloudbuild.yaml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import hcl2
import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TF = ROOT / "terraform"


def tool(name: str) -> str:
    """A checker installed in the venv (or on PATH); a missing one fails the test."""
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or pytest.fail(f"{name} not installed"))


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def unq(value):
    """python-hcl2 keeps the quotes of string literals and keys: drop them."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def tf_file(name: str) -> dict:
    return hcl2.load((TF / name).open())


def tf_blocks(kind: str, files: list[str] | None = None) -> dict:
    """Every block of one kind across terraform/*.tf (or ``files``), keyed by its labels."""
    out: dict = {}
    names = files or [f.name for f in sorted(TF.glob("*.tf"))]
    for name in names:
        for block in tf_file(name).get(kind, []):
            for label, body in block.items():
                if kind in {"resource", "data"}:
                    for inner_name, inner in body.items():
                        out[(unq(label), unq(inner_name))] = inner
                else:
                    out[unq(label)] = body
    return out


def tf_locals(files: list[str] | None = None, unquote: bool = True) -> dict:
    out = {}
    names = files or [f.name for f in sorted(TF.glob("*.tf"))]
    for name in names:
        for block in tf_file(name).get("locals", []):
            out.update({k: unq(v) if unquote else v for k, v in block.items()
                        if not k.startswith("__")})
    return out


def dockerfile_parser() -> DockerfileParser:
    return DockerfileParser(path=str(ROOT / "Dockerfile"))


def docker_args(parser: DockerfileParser) -> dict[str, str | None]:
    """Every ARG of every stage, with its default (the parser's .args sees one stage only)."""
    out: dict[str, str | None] = {}
    for inst in parser.structure:
        if inst["instruction"] == "ARG":
            name, _, default = inst["value"].partition("=")
            out[name] = default.strip('"') if default else None
    return out


def cloudbuild_config() -> dict:
    return yaml.safe_load((ROOT / "cloudbuild.yaml").read_text())


def terraform() -> str:
    """The terraform binary; a skip where it is missing (a failure under CI_REQUIRE_ALL)."""
    path = shutil.which("terraform")
    if path is None:
        if os.environ.get("CI_REQUIRE_ALL"):
            pytest.fail("terraform is not installed")
        pytest.skip("terraform not installed")
    return path
