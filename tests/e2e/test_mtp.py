"""End to end: multi-token prediction (SPEC_MTP) on real servers, on the tiny Hunyuan v3 GGUF
with one NextN layer (tests/support/tiny_mtp.py). On the echo model the MTP head predicts what
the model samples, so its drafts are kept; on random weights they are mostly turned down. Either
way the replies must be the bytes a server without speculation sends (temperature 0, seeded
sampling, logprobs, a JSON-schema grammar, a stream, n > 1, side by side, a second turn reusing
the first's KV). A GGUF that claims NextN layers without their tensors does not crash the
server: SPEC_MTP=auto serves without, SPEC_MTP=on stops with a message saying why."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest
import requests

from tests.support.server import ServerProcess, running_server
from tests.support.tiny_bert import build_tiny_bert
from tests.support.tiny_mtp import build_tiny_mtp

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
# SPEC_ADAPTIVE off: every step drafts (on this CPU the gate would mostly turn drafting off)
BASE = {"PARALLEL": "4", "CTX_SIZE": "512", "SPEC_ADAPTIVE": "false", "CHAT_TEMPLATE": TEMPLATE}
PROMPTS = ["the cat sat on the", "a b c d e f"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp")
    vocab = build_tiny_bert(d / "bert.gguf")
    return {"echo": build_tiny_mtp(d / "echo.gguf", vocab, echo=True),
            "rand": build_tiny_mtp(d / "rand.gguf", vocab),
            "bare": build_tiny_mtp(d / "bare.gguf", vocab, nextn=False)}


@pytest.fixture(scope="module", params=["echo", "rand"])
def pair(request, models):
    """A server without speculation and one drafting with the model's MTP layer."""
    model = str(models[request.param])
    with (running_server({**BASE, "MODEL": model, "SPEC_MTP": "off"}) as plain,
          running_server({**BASE, "MODEL": model, "SPEC_MTP": "on"}) as mtp):
        yield request.param, plain, mtp


def post(srv: ServerProcess, path: str, **body) -> dict:
    r = requests.post(srv.url(path), json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def same_logprobs(got: dict, want: dict) -> None:
    assert got["tokens"] == want["tokens"]
    assert got["top_logprobs"] == [{k: pytest.approx(v, abs=0.05) for k, v in d.items()}
                                   for d in want["top_logprobs"]]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completions_are_the_same_bytes_with_logprobs(pair, prompt):
    name, plain, mtp = pair
    kw = {"prompt": prompt, "temperature": 0, "max_tokens": 48, "logprobs": 3}
    want, got = post(plain, "/v1/completions", **kw), post(mtp, "/v1/completions", **kw)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    same_logprobs(got["choices"][0]["logprobs"], want["choices"][0]["logprobs"])
    t = got["timings"]
    assert t["predicted_n"] == got["usage"]["completion_tokens"]
    assert t["draft_n"] > 0
    if name == "echo":  # the head predicts the model's own greedy token: every draft kept
        assert t["draft_n_accepted"] == t["draft_n"]
    else:
        assert t["draft_n_accepted"] < t["draft_n"]
    assert "timings" not in want


def test_seeded_chat_a_grammar_and_n_choices_are_the_same(pair):
    """A GBNF grammar (the tiny vocabulary has no braces or quotes for a JSON schema's)."""
    _, plain, mtp = pair
    grammar = 'root ::= word (" " word)*\nword ::= "cat" | "dog" | "hello" | [0-9]+'
    kw = {"messages": [{"role": "user", "content": "the cat"}], "n": 2,
          "temperature": 0.8, "seed": 5, "max_tokens": 40, "grammar": grammar}
    want, got = post(plain, "/v1/chat/completions", **kw), post(mtp, "/v1/chat/completions", **kw)
    assert [c["message"] for c in got["choices"]] == [c["message"] for c in want["choices"]]
    assert [c["finish_reason"] for c in got["choices"]] == \
           [c["finish_reason"] for c in want["choices"]]


def test_a_stream_and_the_anthropic_api_are_the_same(pair):
    _, plain, mtp = pair

    def streamed(srv: ServerProcess) -> str:
        text = []
        with requests.post(srv.url("/v1/chat/completions"), stream=True, timeout=120, json={
                "messages": [{"role": "user", "content": PROMPTS[0]}], "temperature": 0,
                "max_tokens": 40, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        text.append(c["delta"].get("content") or "")
        return "".join(text)

    assert streamed(mtp) == streamed(plain)
    kw = {"model": "m", "max_tokens": 40, "temperature": 0,
          "messages": [{"role": "user", "content": PROMPTS[1]}]}
    assert post(mtp, "/v1/messages", **kw)["content"] == post(plain, "/v1/messages", **kw)["content"]


def test_side_by_side_and_a_second_turn_are_the_same(pair):
    """Four requests at once (the head drafts for all of them in one batch per position),
    then a prompt extending the first (its KV reused: the head's follows the cut)."""
    name, plain, mtp = pair

    def run(srv: ServerProcess) -> list[str]:
        with cf.ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda p: post(srv, "/v1/completions", prompt=p, temperature=0,
                                                max_tokens=40)["choices"][0]["text"],
                                 [*PROMPTS, *(p + " x" for p in PROMPTS)]))
        again = post(srv, "/v1/completions", prompt=PROMPTS[0] + outs[0][:10] + " y",
                     temperature=0, max_tokens=40)
        return [*outs, again["choices"][0]["text"]]

    assert run(mtp) == run(plain)
    health = requests.get(mtp.url("/health"), timeout=10).json()["engine"]
    figures = health["mtp"]
    assert figures["draft_tokens"] >= figures["draft_tokens_accepted"] > 0 or name == "rand"
    assert figures["sequences_unfollowed"] == 0
    metrics = requests.get(mtp.url("/metrics"), timeout=10).text
    line = next(x for x in metrics.splitlines()
                if x.startswith("vertex_gguf_spec_mtp_draft_tokens_total"))
    assert float(line.split()[-1]) == figures["draft_tokens"]


def test_a_gguf_claiming_nextn_layers_without_their_tensors(models):
    with running_server({**BASE, "MODEL": str(models["bare"]), "SPEC_MTP": "auto"}) as srv:
        assert post(srv, "/v1/completions", prompt="a b", max_tokens=4)["choices"]
        assert "mtp" not in requests.get(srv.url("/health"), timeout=10).json()["engine"]
        assert "multi-token prediction is off" in srv.logs()
    srv = ServerProcess({**BASE, "MODEL": str(models["bare"]), "SPEC_MTP": "on"})
    try:
        assert srv.exit_code() != 0
        assert "SPEC_MTP=on: the model claims 1 MTP layer(s) but has no " \
               "blk.2.nextn.eh_proj.weight tensor" in srv.logs()
    finally:
        srv.stop()


def test_spec_mtp_on_a_model_without_mtp_layers_is_a_startup_error(default_model):
    srv = ServerProcess({"MODEL": str(default_model), "SPEC_MTP": "on"})
    try:
        assert srv.exit_code() != 0
        assert "SPEC_MTP=on: the model (" in srv.logs() and "has no MTP layers" in srv.logs()
    finally:
        srv.stop()
