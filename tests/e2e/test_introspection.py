"""End to end with the real default model through a real gunicorn: model aliases through the
official openai and anthropic SDKs and /v1/models, and llama-server's introspection routes
(/tokenize, /detokenize, /props, /slots)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import anthropic
import openai
import pytest
import requests

from tests.support.server import running_server

ALIASES = ["smol", "gpt-4o-mini", "org/model"]
ASK = [{"role": "user", "content": "What is the capital of France?"}]
TEXT = "Hello, world! Grüße 世界 🙂"  # "ü", "世" and "🙂" span several byte-level tokens
N_VOCAB = 49152  # SmolLM2's
IM_START = 1  # <|im_start|>: SmolLM2's BOS, and a control token


@pytest.fixture(scope="module")
def srv(default_model):
    with running_server({"PARALLEL": "2", "SERVED_MODEL_NAME": ",".join(ALIASES),
                         "MODEL_TAGS": "tiny,test", "STREAM_HEARTBEAT_SECONDS": "0"}) as server:
        yield server


def with_bos(model: Path, into: Path) -> Path:
    """A copy of the model whose GGUF says to add a BOS (SmolLM2's says not to): the bool after
    the key's name and its type (u32 7, bool) is flipped in place."""
    out = into / "smol-bos.gguf"
    shutil.copyfile(model, out)
    key = b"tokenizer.ggml.add_bos_token"
    with open(out, "r+b") as fh:
        head = fh.read(4 << 20)
        at = head.find(key)
        assert at > 0 and head.count(key) == 1, "add_bos_token not found in the GGUF header"
        assert head[at + len(key):at + len(key) + 5] == b"\x07\x00\x00\x00\x00"  # bool false
        fh.seek(at + len(key) + 4)
        fh.write(b"\x01")
    return out


@pytest.fixture(scope="module")
def strict_srv(default_model, tmp_path_factory):
    """The model with a BOS, STRICT_MODEL_NAME on and /slots off."""
    path = with_bos(default_model, tmp_path_factory.mktemp("bos"))
    with running_server({"MODEL": str(path), "PARALLEL": "1", "STRICT_MODEL_NAME": "1",
                         "SLOTS_ENDPOINT": "off"}) as server:
        yield server


def both(text: str) -> dict[str, str]:
    """A /detokenize answer: llama-server's name and vLLM's (both send the same body)."""
    return {"content": text, "prompt": text}


def post(srv, path: str, body: dict, status: int = 200) -> dict:
    resp = requests.post(srv.url(path), json=body, timeout=60)
    assert resp.status_code == status, resp.text
    return resp.json()


def piece_bytes(piece: str | list[int]) -> bytes:
    return bytes(piece) if isinstance(piece, list) else piece.encode()


# ---- /tokenize and /detokenize -----------------------------------------------------------------


def test_tokenize_detokenize_round_trip(srv):
    tokens = post(srv, "/tokenize", {"content": TEXT})["tokens"]
    assert tokens and all(isinstance(t, int) and 0 <= t < N_VOCAB for t in tokens)
    assert post(srv, "/detokenize", {"tokens": tokens}) == both(TEXT)


def test_tokenize_with_pieces(srv):
    ids = post(srv, "/tokenize", {"content": TEXT})["tokens"]
    pieces = post(srv, "/tokenize", {"content": TEXT, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == ids
    assert b"".join(piece_bytes(p["piece"]) for p in pieces) == TEXT.encode()
    assert any(isinstance(p["piece"], list) for p in pieces)  # half a character: its bytes
    assert any(p["piece"] == "Hello" for p in pieces)


def test_parse_special(srv):
    assert post(srv, "/tokenize", {"content": "<|im_start|>"})["tokens"] == [IM_START]
    plain = post(srv, "/tokenize", {"content": "<|im_start|>", "parse_special": False})["tokens"]
    assert len(plain) > 1 and IM_START not in plain
    assert post(srv, "/detokenize", {"tokens": plain}) == both("<|im_start|>")


def test_add_special_adds_the_bos_the_model_asks_for(srv, strict_srv):
    for server in (srv, strict_srv):
        assert post(server, "/tokenize", {"content": "Hi"})["tokens"][0] != IM_START
    # SmolLM2's GGUF says no BOS: add_special adds none, as llama.cpp's tokenizer says
    plain = post(srv, "/tokenize", {"content": "Hi"})["tokens"]
    assert post(srv, "/tokenize", {"content": "Hi", "add_special": True})["tokens"] == plain
    # the same vocabulary with add_bos_token set: the BOS comes first
    bos = post(strict_srv, "/tokenize", {"content": "Hi", "add_special": True})["tokens"]
    assert bos == [IM_START, *plain]
    assert post(strict_srv, "/detokenize", {"tokens": bos}) == both("<|im_start|>Hi")


@pytest.mark.parametrize("tokens", [[5, N_VOCAB], [-1], [2**40]])
def test_detokenize_refuses_ids_outside_the_vocabulary(srv, tokens):
    err = post(srv, "/detokenize", {"tokens": tokens}, status=400)["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "tokens"
    assert "not in the vocabulary" in err["message"] and f"0..{N_VOCAB - 1}" in err["message"]
    assert requests.get(srv.url("/health"), timeout=10).status_code == 200  # still alive


# ---- /props ------------------------------------------------------------------------------------


def test_props(srv, default_model):
    resp = requests.get(srv.url("/props"), timeout=10)
    assert resp.status_code == 200
    body = resp.json()
    assert body["model_alias"] == "smol" and body["aliases"] == ALIASES
    assert body["tags"] == ["tiny", "test"]
    assert body["model_path"] == default_model.name  # the basename only
    assert str(default_model.parent) not in resp.text
    assert body["total_slots"] == 2 and body["n_ctx"] == 4096
    assert body["default_generation_settings"]["n_ctx"] == 4096
    assert "<|im_start|>" in body["chat_template"]
    meta = body["meta"]
    assert (meta["n_vocab"], meta["vocab_type"], meta["vocab_type_name"]) == (N_VOCAB, 2, "bpe")
    assert meta["n_ctx_train"] == 8192 and meta["n_embd"] == 576
    assert meta["n_params"] > 100_000_000 and meta["size"] > 50_000_000
    assert "llama-cpp-python" in body["build_info"]
    assert body["settings"]["parallel"] == 2 and "model_cache_dir" not in body["settings"]
    # one C++ runtime, pinned first in the master and so in the worker (app.base.cxx_runtime)
    cxx = body["cxx_runtime"]
    assert cxx["pinned"] and cxx["global_scope"] and cxx["library"].startswith("libstdc++.so.6")
    assert "C++ runtime: libstdc++.so.6" in srv.logs()
    # how replies are read, said at load too: SmolLM2's template teaches no tool format and no
    # thought syntax, and its role markers are dropped from replies
    seen = body["formats"]
    assert seen["tool_format"] == "generic" and seen["thought_format"] is None
    assert "<|im_end|>" in seen["drops"] and not seen["reads"]
    assert "replies read as: tool calls generic, thoughts none" in srv.logs()


# ---- /slots ------------------------------------------------------------------------------------


def test_slots_show_a_streaming_generation(srv):
    prompt = post(srv, "/tokenize", {"content": "Once upon a time, in a land far away, " * 4})["tokens"]
    post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 1})  # its slot keeps the prompt
    # long enough to be running whenever /slots is asked (it is cancelled once seen)
    body = {"prompt": prompt, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with requests.post(srv.url("/v1/completions"), json=body, stream=True, timeout=60) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for line in lines:
            if line.startswith(b"data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break
        rows = requests.get(srv.url("/slots"), timeout=10).json()
        assert [r["id"] for r in rows] == [0, 1]
        (busy,) = [r for r in rows if r["is_processing"]]
        assert busy["n_ctx"] == 4096 and busy["n_prompt_tokens"] == len(prompt)
        assert busy["n_prompt_tokens_cached"] == len(prompt) - 1  # the first request's prefix
        assert busy["n_prompt_tokens_processed"] == len(prompt)
        assert busy["n_decoded"] >= 1 and busy["next_token"]["has_next_token"] is True
        assert busy["next_token"]["n_remain"] == 3000 - busy["n_decoded"]
    for _ in range(100):  # the client hung up: the generation is cancelled, the slot freed
        if not any(r["is_processing"] for r in requests.get(srv.url("/slots"), timeout=10).json()):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the cancelled generation still holds its slot")


def test_slots_off_is_501(strict_srv):
    resp = requests.get(strict_srv.url("/slots"), timeout=10)
    assert resp.status_code == 501
    assert resp.json()["error"]["type"] == "not_supported_error"


# ---- aliases -----------------------------------------------------------------------------------


def test_openai_sdk_models_and_aliases(srv):
    sdk = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0)
    (card,) = sdk.models.list().data
    assert card.id == "smol"
    extra = card.model_dump()
    assert extra["aliases"] == ALIASES and extra["tags"] == ["tiny", "test"]
    assert extra["meta"]["n_vocab"] == N_VOCAB
    for name in ALIASES:
        assert sdk.models.retrieve(name).id == "smol"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-5")
    chat = sdk.chat.completions.create(model="gpt-4o-mini", messages=ASK, max_tokens=4,
                                       temperature=0)
    assert chat.model == "gpt-4o-mini"
    chunks = list(sdk.chat.completions.create(model="org/model", messages=ASK, max_tokens=4,
                                              temperature=0, stream=True))
    assert chunks and {c.model for c in chunks} == {"org/model"}
    other = sdk.completions.create(model="davinci-002", prompt="Hi", max_tokens=2)
    assert other.model == "smol"  # not an alias: the id (and served: STRICT_MODEL_NAME is off)


def test_anthropic_sdk_echoes_an_alias(srv):
    sdk = anthropic.Anthropic(base_url=srv.url(""), api_key="x", max_retries=0)
    msg = sdk.messages.create(model="gpt-4o-mini", max_tokens=4, messages=ASK)
    assert msg.model == "gpt-4o-mini"
    assert sdk.messages.create(model="unknown", max_tokens=4, messages=ASK).model == "smol"


def test_strict_unknown_model_is_not_found(strict_srv):
    oa = openai.OpenAI(base_url=strict_srv.url("/v1"), api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as nf:
        oa.chat.completions.create(model="gpt-4o-mini", messages=ASK, max_tokens=4)
    assert nf.value.code == "model_not_found"
    assert oa.chat.completions.create(model="smol-bos", messages=ASK, max_tokens=2).model == "smol-bos"
    an = anthropic.Anthropic(base_url=strict_srv.url(""), api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as anf:
        an.messages.create(model="claude-x", max_tokens=4, messages=ASK)
    assert anf.value.body["error"]["type"] == "not_found_error"
