"""End to end with the real default model and the real harness: lm-eval 0.4.13 (its own
interpreter, tests/support/lmeval.py) evaluates small local tasks of every output type against
the server, unmodified: ``local-completions`` (tokens sent as ids, the remote tokenizer) for
multiple_choice, loglikelihood, loglikelihood_rolling and generate_until, and the ``gguf`` model
(text prompts, ``text_offset``) for multiple_choice, loglikelihood and generate_until. Every
log-likelihood the harness reports is checked against an independent computation
(tests/support/reference.py), and every generation against the server's own greedy answer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import requests

from tests.support.lmeval import MC, PROMPTS, TEXTS, UNTIL, evaluate, require_lmeval
from tests.support.reference import Reference
from tests.support.server import running_server

DEFAULT_MAX = 24  # DEFAULT_MAX_TOKENS: the gguf model asks for no limit when it generates


@pytest.fixture(scope="module")
def srv(default_model):
    # flash attention off: scores that do not depend on the batch (tests/support/reference.py)
    with running_server({"PARALLEL": "2", "FLASH_ATTN": "off",
                         "DEFAULT_MAX_TOKENS": str(DEFAULT_MAX)}) as server:
        yield server


def tokenize(srv, text: str) -> list[int]:
    """As lm-eval's remote tokenizer asks: vLLM's form, no special tokens added."""
    resp = requests.post(srv.url("/tokenize"), json={"prompt": text, "add_special_tokens": False},
                         timeout=30)
    return resp.json()["tokens"]


def expected(srv, reference: Reference, context: str | list[int],
             continuation: str) -> tuple[float, bool]:
    """(the continuation's log-likelihood after the context, whether greedy decoding gives it)."""
    ctx = tokenize(srv, context) if isinstance(context, str) else context
    cont = tokenize(srv, continuation)
    rows = reference.rows(ctx + cont)
    at = [len(ctx) + j - 1 for j in range(len(cont))]
    return (float(sum(rows[i, t] for i, t in zip(at, cont, strict=True))),
            all(int(rows[i].argmax()) == t for i, t in zip(at, cont, strict=True)))


def check_loglikelihoods(srv, reference, samples: dict) -> list[list[float]]:
    """Every (context, continuation) the harness scored agrees with the reference; the
    log-likelihoods by document, choice by choice."""
    by_doc = []
    for sample in samples:
        lls = []
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"],
                                                 strict=True):
            ll, greedy = resp[0]
            want, want_greedy = expected(srv, reference, context, continuation)
            assert abs(ll - want) <= 1e-3, (context, continuation, ll, want)
            assert greedy == want_greedy, (context, continuation)
            lls.append(ll)
        by_doc.append(lls)
    return by_doc


def greedy(srv, prompt: str, **limit) -> str:
    body = {"prompt": prompt, "temperature": 0, "stop": UNTIL, **limit}
    return requests.post(srv.url("/v1/completions"), json=body, timeout=120).json()[
        "choices"][0]["text"]


def test_local_completions_every_output_type(srv, reference, tmp_path):
    python = require_lmeval()
    args = (f"base_url={srv.url('/v1/completions')},model=m,tokenizer_backend=remote,"
            "max_retries=1")
    out = evaluate(python, "local-completions", args,
                   ["vg_mc", "vg_ll", "vg_rolling", "vg_gen"], tmp_path)
    res, samples = out["results"], out["samples"]
    # multiple choice: scores agree, and the accuracy is what they imply
    mc = check_loglikelihoods(srv, reference, samples["vg_mc"])
    docs = [s["doc"] for s in samples["vg_mc"]]
    assert sorted(d["question"] for d in docs) == sorted(d["question"] for d in MC)
    acc = np.mean([int(np.argmax(lls)) == d["answer"] for lls, d in zip(mc, docs, strict=True)])
    assert res["vg_mc"]["acc,none"] == pytest.approx(acc)
    check_loglikelihoods(srv, reference, samples["vg_ll"])
    # rolling: one window per short document, after the harness' prefix token
    prefix = tokenize(srv, "<|im_start|>")
    total, words = 0.0, 0
    for sample in samples["vg_rolling"]:
        text = sample["doc"]["text"]
        want, _ = expected(srv, reference, prefix, text)
        got = sample["resps"][0][0]
        assert abs(got - want) <= 1e-3, (text, got, want)
        total += got
        words += len(text.split())
    assert len(samples["vg_rolling"]) == len(TEXTS)
    assert res["vg_rolling"]["word_perplexity,none"] == pytest.approx(math.exp(-total / words),
                                                                    rel=1e-6)
    # generation: what the server answers greedily to the same prompt
    for sample in samples["vg_gen"]:
        question = sample["doc"]["question"]
        assert sample["resps"][0][0] == greedy(srv, question, max_tokens=16), question
    assert len(samples["vg_gen"]) == len(PROMPTS)


def test_the_gguf_model(srv, reference, tmp_path):
    """lm-eval's ``gguf`` model: text prompts with echo and ``logprobs: 10``, the continuation
    found by ``text_offset``; and generation, which sends ``logprobs`` and no ``max_tokens``."""
    python = require_lmeval()
    for d in MC:  # the tasks' texts tokenize the same whole or in two parts
        for choice in d["choices"]:
            assert tokenize(srv, d["question"] + choice) == (
                tokenize(srv, d["question"]) + tokenize(srv, choice))
    out = evaluate(python, "gguf", f"base_url={srv.base}", ["vg_mc", "vg_ll", "vg_gen"],
                   tmp_path)
    mc = check_loglikelihoods(srv, reference, out["samples"]["vg_mc"])
    docs = [s["doc"] for s in out["samples"]["vg_mc"]]
    acc = np.mean([int(np.argmax(lls)) == d["answer"] for lls, d in zip(mc, docs, strict=True)])
    assert out["results"]["vg_mc"]["acc,none"] == pytest.approx(acc)
    check_loglikelihoods(srv, reference, out["samples"]["vg_ll"])
    for sample in out["samples"]["vg_gen"]:
        question = sample["doc"]["question"]
        assert sample["resps"][0][0] == greedy(srv, question).strip(), question
