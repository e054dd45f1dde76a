"""Model names and aliases, and llama-server's introspection routes (/tokenize, /detokenize,
/props, /slots), over the fake engine (fast tier). The fake's tokenizer is byte-level: ids 0-2
are <unk>, <s>, </s>, then byte b is id b + 3."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from pydantic import ValidationError

from app import create_app
from app import settings as settings_mod
from app.engine.fake import FakeEngine
from app.protocol import introspect
from app.settings import Settings, name_list, slots_endpoint_on
from tests.support.app import make_client
from tests.support.clients import paused_stream

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
NAMES = ("smol", "gpt-4o-mini", "org/model")


def aliased(**settings: Any) -> tuple[FakeEngine, Any]:
    engine = FakeEngine(aliases=NAMES, tags=("tiny", "test"))
    return engine, make_client(engine, **settings)


def openai_error(resp, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"error", "request_id"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def both(text: str) -> dict[str, str]:
    """A /detokenize answer: llama-server's name and vLLM's (both send the same body)."""
    return {"content": text, "prompt": text}


def sse_data(resp) -> list[dict[str, Any]]:
    out = []
    for block in resp.get_data(as_text=True).split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[len("data: "):]))
    return out


# ---- settings ----------------------------------------------------------------------------------


def test_served_model_name_is_a_list_of_aliases(monkeypatch):
    s = Settings(served_model_name=" smol, gpt-4o-mini ,smol,org/model")
    assert name_list(s.served_model_name) == NAMES  # stripped, first kept, order kept
    monkeypatch.setenv("SERVED_MODEL_NAME", "a,b")
    monkeypatch.setenv("MODEL_TAGS", "x, y,x")
    s = Settings()
    assert (name_list(s.served_model_name), name_list(s.model_tags)) == (("a", "b"), ("x", "y"))
    assert name_list(None) == ()


@pytest.mark.parametrize("field", ["served_model_name", "model_tags"])
@pytest.mark.parametrize("value", ["a,,b", "a,", ", a", " , "])
def test_an_empty_name_is_a_settings_error(field, value):
    with pytest.raises(ValidationError, match="empty name"):
        Settings(**{field: value})


def test_slots_endpoint_auto_follows_the_api_key(monkeypatch):
    assert slots_endpoint_on(Settings())  # no API key exists yet: auto is on
    assert slots_endpoint_on(Settings(slots_endpoint="on"))
    assert not slots_endpoint_on(Settings(slots_endpoint="off"))
    monkeypatch.setattr(settings_mod, "api_key_configured", lambda s: True)
    assert not slots_endpoint_on(Settings())
    assert slots_endpoint_on(Settings(slots_endpoint="on"))


# ---- the model list ----------------------------------------------------------------------------


def test_models_list_the_aliases_tags_and_meta():
    _, client = aliased()
    (card,) = client.get("/v1/models").get_json()["data"]
    assert card["id"] == "smol" and card["object"] == "model" and card["owned_by"] == "vertex-gguf"
    assert card["aliases"] == list(NAMES) and card["tags"] == ["tiny", "test"]
    assert isinstance(card["created"], int)
    meta = card["meta"]
    assert meta["vocab_type"] == 2 and meta["vocab_type_name"] == "bpe"  # llama-server's number
    assert {k: meta[k] for k in ("n_ctx", "n_ctx_train", "n_vocab")} == {
        "n_ctx": 512, "n_ctx_train": 512, "n_vocab": 259}
    assert all(meta[k] > 0 for k in ("n_embd", "n_params", "size"))


@pytest.mark.parametrize("name", NAMES)
def test_a_model_card_answers_for_any_alias(name):
    _, client = aliased()
    resp = client.get(f"/v1/models/{name}")
    assert resp.status_code == 200 and resp.get_json()["id"] == "smol"


def test_an_unknown_model_card_is_model_not_found():
    _, client = aliased()
    err = openai_error(client.get("/v1/models/gpt-5"), 404)
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"


# ---- the model field of answers ----------------------------------------------------------------


REQUESTS = [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"prompt": "Once upon"}),
    ("/v1/messages", {**CHAT, "max_tokens": 8}),
    ("/v1/responses", {"input": "hi"}),
]


@pytest.mark.parametrize("path, body", REQUESTS)
@pytest.mark.parametrize("stream", [False, True])
def test_answers_echo_an_alias_else_the_id(path, body, stream):
    _, client = aliased()
    for asked, answered in (("gpt-4o-mini", "gpt-4o-mini"), ("org/model", "org/model"),
                            ("gpt-5", "smol"), (None, "smol")):
        req = {**body, "stream": stream} | ({"model": asked} if asked else {})
        resp = client.post(path, json=req)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        if not stream:
            assert resp.get_json()["model"] == answered
            continue
        models = set()
        for ev in sse_data(resp):  # every chunk, or the message / response each event carries
            obj = ev.get("message") or ev.get("response") or ev
            if "model" in obj:
                models.add(obj["model"])
        assert models == {answered}


def test_a_vertex_instance_without_a_model_gets_the_id():
    _, client = aliased(strict_model_name=True)
    body = client.post("/predict", json={"instances": [CHAT, {**CHAT, "model": "org/model"}]}).get_json()
    assert [p["model"] for p in body["predictions"]] == ["smol", "org/model"]


@pytest.mark.parametrize("path, body", REQUESTS)
def test_strict_refuses_an_unknown_model_before_generating(path, body):
    engine, client = aliased(strict_model_name=True)
    resp = client.post(path, json={**body, "model": "gpt-5"})
    assert resp.status_code == 404, resp.get_data(as_text=True)
    if path == "/v1/messages":
        assert resp.get_json()["error"]["type"] == "not_found_error"
    else:
        err = resp.get_json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
    assert engine.requests == []  # nothing reached the engine
    ok = client.post(path, json={**body, "model": "gpt-4o-mini"})
    assert ok.status_code == 200 and len(engine.requests) == 1


def test_strict_refuses_counting_tokens_for_an_unknown_model():
    _, client = aliased(strict_model_name=True)
    resp = client.post("/v1/messages/count_tokens", json={**CHAT, "model": "gpt-5"})
    assert resp.status_code == 404


def test_service_model_name():
    _, client = aliased()
    svc = client.application.extensions["vertex_gguf"]
    assert [svc.model_name(n) for n in ("org/model", "SMOL", None)] == ["org/model", "smol", "smol"]


def wsgi_http(app):
    import httpx

    return httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://sdk.test")


def test_openai_sdk_lists_retrieves_and_echoes_aliases():
    import openai

    engine = FakeEngine(aliases=NAMES)
    app = create_app(Settings(strict_model_name=True), engine=engine)
    with wsgi_http(app) as http:
        sdk = openai.OpenAI(base_url="http://sdk.test/v1", api_key="x", http_client=http,
                            max_retries=0)
        assert [m.id for m in sdk.models.list().data] == ["smol"]
        assert sdk.models.retrieve("gpt-4o-mini").id == "smol"
        chat = sdk.chat.completions.create(model="gpt-4o-mini", messages=CHAT["messages"])
        assert chat.model == "gpt-4o-mini"
        chunks = list(sdk.chat.completions.create(model="org/model", messages=CHAT["messages"],
                                                  stream=True))
        assert chunks and {c.model for c in chunks} == {"org/model"}
        with pytest.raises(openai.NotFoundError) as nf:
            sdk.chat.completions.create(model="gpt-5", messages=CHAT["messages"])
        assert nf.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            sdk.models.retrieve("gpt-5")


def test_anthropic_sdk_echoes_an_alias_and_strict_is_not_found():
    import anthropic
    import httpx2

    engine = FakeEngine(aliases=("smol", "my-claude"))
    app = create_app(Settings(strict_model_name=True), engine=engine)
    with httpx2.Client(transport=httpx2.WSGITransport(app=app), base_url="http://sdk.test") as http:
        sdk = anthropic.Anthropic(base_url="http://sdk.test", api_key="x", http_client=http,
                                  max_retries=0)
        msg = sdk.messages.create(model="my-claude", max_tokens=8, messages=CHAT["messages"])
        assert msg.model == "my-claude"
        with sdk.messages.stream(model="my-claude", max_tokens=8,
                                 messages=CHAT["messages"]) as stream:
            assert stream.get_final_message().model == "my-claude"
        with pytest.raises(anthropic.NotFoundError) as nf:
            sdk.messages.create(model="claude-opus-4", max_tokens=8, messages=CHAT["messages"])
        assert nf.value.body["error"]["type"] == "not_found_error"


# ---- /tokenize and /detokenize -----------------------------------------------------------------


def test_tokenize_ids_and_pieces(client):
    assert client.post("/tokenize", json={"content": "hi"}).get_json() == {"tokens": [107, 108]}
    body = client.post("/tokenize", json={"content": "hé<s>", "with_pieces": True}).get_json()
    # "é" is two bytes, each a token whose piece is not UTF-8 on its own: its byte values
    assert body == {"tokens": [{"id": 107, "piece": "h"}, {"id": 198, "piece": [0xC3]},
                               {"id": 172, "piece": [0xA9]}, {"id": 1, "piece": "<s>"}]}


def test_tokenize_add_special_and_parse_special(client):
    assert client.post("/tokenize", json={"content": "<s>"}).get_json()["tokens"] == [1]
    plain = client.post("/tokenize", json={"content": "<s>", "parse_special": False}).get_json()
    assert plain["tokens"] == [ord(c) + 3 for c in "<s>"]
    bos = client.post("/tokenize", json={"content": "hi", "add_special": True}).get_json()
    assert bos["tokens"] == [1, 107, 108]


def test_detokenize_round_trips(client):
    text = "Grüße, <s> 世界!"
    tokens = client.post("/tokenize", json={"content": text}).get_json()["tokens"]
    assert client.post("/detokenize", json={"tokens": tokens}).get_json() == both(text)
    assert client.post("/detokenize", json={"tokens": []}).get_json() == both("")
    # half a character at the end: the replacement character, as llama-server's
    assert client.post("/detokenize", json={"tokens": [107, 198]}).get_json() == both("h\ufffd")


@pytest.mark.parametrize("tokens, message", [
    ([1, 259], "token id 259 is not in the vocabulary (0..258)"),
    ([-1], "token id -1 is not in the vocabulary"),
    ([2**80], "is not in the vocabulary"),
    ([True], "tokens.0"),
    (["7"], "tokens.0"),
    ("7", "tokens"),
])
def test_detokenize_refuses_bad_ids(client, tokens, message):
    err = openai_error(client.post("/detokenize", json={"tokens": tokens}), 400)
    assert message in err["message"] and err["param"].startswith("tokens")


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {}, "content"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
    ("/tokenize", {"content": "x", "sneaky": 1}, "sneaky"),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", [], None),
])
def test_introspection_bodies_are_checked(client, path, body, param):
    assert openai_error(client.post(path, json=body), 400)["param"] == param


def test_detokenize_and_pieces_are_bounded(client, monkeypatch):
    monkeypatch.setattr(introspect, "MAX_LISTED_TOKENS", 4)
    err = openai_error(client.post("/detokenize", json={"tokens": [5] * 5}), 400)
    assert "at most 4" in err["message"]
    err = openai_error(client.post("/tokenize", json={"content": "hello", "with_pieces": True}), 400)
    assert err["param"] == "with_pieces"
    assert len(client.post("/tokenize", json={"content": "hello"}).get_json()["tokens"]) == 5


def test_tokenize_runs_off_the_request_thread(fake_engine, client):
    seen: list[int] = []
    real = fake_engine.tokenize

    def spy(*args: Any) -> list[int]:
        seen.append(threading.get_ident())
        return real(*args)

    fake_engine.tokenize = spy  # type: ignore[method-assign]
    assert client.post("/tokenize", json={"content": "hi"}).status_code == 200
    assert seen and seen[0] != threading.get_ident()


def test_introspection_while_loading_is_503():
    client = make_client(FakeEngine(ready=False))
    assert openai_error(client.post("/tokenize", json={"content": "x"}), 503)["code"] == "model_loading"
    assert client.get("/props").status_code == 503
    assert client.get("/slots").status_code == 503


def test_strict_checks_the_model_of_tokenize():
    _, client = aliased(strict_model_name=True)
    assert client.post("/tokenize", json={"content": "x", "model": "org/model"}).status_code == 200
    err = openai_error(client.post("/tokenize", json={"content": "x", "model": "gpt-5"}), 404)
    assert err["code"] == "model_not_found"


# ---- /props ------------------------------------------------------------------------------------


def test_props_shape(client):
    body = client.get("/props").get_json()
    assert body["model_alias"] == "fake-model" and body["aliases"] == ["fake-model"]
    assert body["model_path"] == "fake-model.gguf"  # the file's name, never where it lives
    assert body["total_slots"] == 8 and body["n_ctx"] == 512
    assert body["default_generation_settings"]["n_ctx"] == 512
    assert body["default_generation_settings"]["params"]["temperature"] == 1.0
    assert body["meta"]["n_vocab"] == 259 and body["chat_template"] == ""
    assert body["build_info"].startswith("vertex-gguf ")
    assert body["settings"]["parallel"] == 8 and body["settings"]["slots_endpoint"] == "auto"


def test_props_say_how_replies_are_read():
    """The tool-call format and thought syntax the chat template teaches, and which of the
    control tokens it names a reply parser reads and which are dropped from replies."""
    from dataclasses import replace

    template = ("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
                "{% if tools %}<tool_call>{{ tools | tojson }}</tool_call>{% endif %}<think>")
    engine = FakeEngine(chat_template=template)
    engine._info = replace(engine._info, control_texts=(
        "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
        "<|unused|>"))
    body = make_client(engine).get("/props").get_json()
    assert body["formats"] == {
        "tool_format": "hermes", "thought_format": "think",
        "reads": ["<tool_call>", "</tool_call>", "<think>"],
        "drops": ["<|im_start|>", "<|im_end|>"],
    }
    plain = make_client(FakeEngine()).get("/props").get_json()["formats"]
    assert plain == {"tool_format": "generic", "thought_format": None, "reads": [], "drops": []}


class LeakySettings(Settings):
    """Settings some later issue might add; /props must show none of them."""

    api_key: str = "SENTINEL-api-key"
    hf_token: str = "SENTINEL-hf-token"
    db_password: str = "SENTINEL-password"
    oauth_client_secret: str = "SENTINEL-secret"
    gcs_credentials_json: str = "SENTINEL-credentials"
    keyfile: str = "SENTINEL-keyfile"
    webhook: str = "https://user:SENTINEL-url@example.com/hook"


def test_props_shows_no_secret_and_no_location():
    settings = LeakySettings(model="gs://SENTINEL-bucket/models/m.gguf",
                             chat_template="/SENTINEL-dir/template.jinja")
    app = create_app(settings, engine=FakeEngine())
    app.testing = True
    # api_key is a real setting now: /props needs it, and must not show it
    resp = app.test_client().get("/props", headers={"x-api-key": "SENTINEL-api-key"})
    text = resp.get_data(as_text=True)
    assert resp.status_code == 200 and "SENTINEL" not in text
    shown = resp.get_json()["settings"]
    # token counts named one by one (DEFAULT_MAX_TOKENS, MAX_TOKENS_LIMIT) are the exception
    assert not [k for k in shown if introspect.SECRET_NAME.search(k)
                and k not in introspect.TOKEN_COUNTS]
    assert all(type(shown[k]) is int for k in introspect.TOKEN_COUNTS)
    assert not {"model", "model_cache_dir", "chat_template", "webhook"} & set(shown)
    assert "special_tokens_in_messages" not in shown  # by name, no exceptions
    assert shown["max_tools"] == 128  # the rest is shown


@pytest.mark.parametrize("name", ["api_key", "HF_TOKEN", "x_secret", "root_password", "credentials",
                                  "keys", "refresh_token_path"])
def test_the_secret_rule_matches_by_name(name):
    assert introspect.SECRET_NAME.search(name)


# ---- /slots ------------------------------------------------------------------------------------


def test_slots_idle(client):
    rows = client.get("/slots").get_json()
    assert [r["id"] for r in rows] == list(range(8))
    assert not any(r["is_processing"] for r in rows)
    assert rows[0]["n_ctx"] == 512 and rows[0]["next_token"]["has_next_token"] is False


def test_slots_show_a_running_generation():
    engine = FakeEngine()
    engine.hold_after = 1  # the generation pauses after its first word until resumed
    client = make_client(engine)
    with paused_stream(client, engine, CHAT) as (_, frames):
        rows = client.get("/slots").get_json()
        (busy,) = [r for r in rows if r["is_processing"]]
        assert busy["n_prompt_tokens"] == engine.handles[-1].prompt_tokens > 0
        assert busy["n_decoded"] == busy["next_token"]["n_decoded"] == 1
        assert busy["next_token"]["has_next_token"] is True
        engine.resume.set()
        rest = b"".join(frames)
        assert b"[DONE]" in rest
    deadline = time.monotonic() + 5  # the fake's thread frees its slot just after the last event
    while any(r["is_processing"] for r in client.get("/slots").get_json()):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_slots_fail_on_no_slot():
    engine = FakeEngine(capacity=1)
    engine.hold_after = 1
    client = make_client(engine)
    assert client.get("/slots?fail_on_no_slot=1").status_code == 200
    with paused_stream(client, engine, CHAT):
        assert client.get("/slots").status_code == 200
        assert openai_error(client.get("/slots?fail_on_no_slot=1"), 503)["message"] == "no slot available"


def test_slots_off_is_501_as_llama_server():
    client = make_client(FakeEngine(), slots_endpoint="off")
    err = openai_error(client.get("/slots"), 501)
    assert err["type"] == "not_supported_error" and err["code"] == "not_supported"
    assert client.get("/props").status_code == 200
