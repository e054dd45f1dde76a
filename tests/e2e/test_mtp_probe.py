"""Issue 53's groundwork: the pinned llama-cpp-python drives llama.cpp's multi-token
prediction (tests/support/mtp_probe.py, in a process of its own) on a tiny NextN GGUF
(tests/support/tiny_mtp.py): the NextN layer is counted apart from the trunk, and on the echo
model, whose MTP head predicts what the trunk does, every draft is the target's greedy token
at its position (the hidden-state handoff and the mirror are right); on random weights the
drafts are still valid token ids."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.tiny_bert import build_tiny_bert
from tests.support.tiny_mtp import build_tiny_mtp

PROMPT = (5, 9, 13, 21, 30)  # the probes' own


def _probe(path, *prompt: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.support.mtp_probe", str(path),
                          *map(str, prompt)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("mtp") / "bert.gguf")


def test_the_echo_models_mtp_drafts_are_the_targets_greedy_tokens(vocab, tmp_path):
    got = _probe(build_tiny_mtp(tmp_path / "echo.gguf", vocab, echo=True))
    assert (got["n_layer"], got["n_nextn"]) == (2, 1)
    assert len(got["drafts"]) == 3 and got["drafts"] == got["greedy"]


def test_random_weights_draft_valid_tokens(vocab, tmp_path):
    got = _probe(build_tiny_mtp(tmp_path / "rand.gguf", vocab))
    assert (got["n_layer"], got["n_nextn"]) == (2, 1)
    assert len(got["drafts"]) == 3 and all(t >= 0 for t in got["drafts"])


def _engine(path) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.support.mtp_engine_probe", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_engines_drafter_drafts_what_the_probe_does(vocab, tmp_path):
    """On random weights, where every draft depends on the hidden states handed over: the
    engine's drafter (two prompt chunks, a checked draft's tail dropped) drafts as the
    probe's written-out calls do, and stays in step with the target after the cut."""
    path = build_tiny_mtp(tmp_path / "rand.gguf", vocab)
    want, got = _probe(path), _engine(path)
    assert (got["sampled"], got["drafts"]) == (want["sampled"], want["drafts"])
    assert got["in_sync"]
    again = _probe(path, *PROMPT, got["sampled"], got["drafts"][0])  # decoded afresh
    assert (got["next"], got["after_cut"]) == (again["sampled"], again["drafts"])
