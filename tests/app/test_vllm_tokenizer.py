"""vLLM's tokenizer routes beside llama-server's (fast tier, the fake engine): GET
/tokenizer_info, POST /tokenize with ``prompt`` or ``messages``, POST /detokenize answering
``prompt`` too; the body's fields pick the form, so llama-server's clients (``content``) keep
theirs. The fake's tokenizer is byte-level: ids 0-2 are <unk>, <s>, </s>, then byte b is id
b + 3 ("h" 107, "i" 108)."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.fake import FakeEngine
from app.engine.types import GenerationRequest
from tests.support.app import make_client

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi <s> there"}]
TOOL = {"type": "function", "function": {"name": "weather", "description": "The weather",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string"}}}}}
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def error(resp, status: int, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(chat_template=TEMPLATE)


@pytest.fixture
def client(engine):
    return make_client(engine)


# ---- GET /tokenizer_info -----------------------------------------------------------------------


def test_tokenizer_info_in_tokenizer_config_names(client):
    info = client.get("/tokenizer_info").get_json()
    assert info["eos_token"] == "</s>" and info["bos_token"] == "<s>"
    assert info["pad_token"] is None  # the GGUF names none
    assert info["add_bos_token"] is True
    assert info["model_max_length"] == info["max_model_len"] == 512
    assert info["vocab_size"] == 259 and info["tokenizer_class"]
    assert info["chat_template"] == TEMPLATE


def test_tokenizer_info_without_a_template_has_none():
    info = make_client(FakeEngine()).get("/tokenizer_info").get_json()
    assert "chat_template" not in info and info["eos_token"] == "</s>"


def test_tokenizer_info_while_loading_is_503():
    resp = make_client(FakeEngine(ready=False)).get("/tokenizer_info")
    assert error(resp, 503)["code"] == "model_loading"


# ---- POST /tokenize: vLLM's text form ----------------------------------------------------------


def test_prompt_form(client):
    body = client.post("/tokenize", json={"prompt": "hi"}).get_json()
    # add_special_tokens defaults to true, as vLLM's: the BOS the model asks for
    assert body == {"count": 3, "max_model_len": 512, "tokens": [1, 107, 108], "token_strs": None}
    plain = client.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False}).get_json()
    assert plain["tokens"] == [107, 108] and plain["count"] == 2


def test_prompt_form_parses_special_tokens_as_an_hf_tokenizer_does(client):
    # lm-eval takes eos_token_id as the first id of /tokenize(eos_token)
    eos = client.get("/tokenizer_info").get_json()["eos_token"]
    body = client.post("/tokenize", json={"prompt": eos, "add_special_tokens": False}).get_json()
    assert body["tokens"] == [2]


def test_prompt_form_token_strs(client):
    body = client.post("/tokenize", json={"prompt": "hé", "add_special_tokens": False,
                                          "return_token_strs": True}).get_json()
    # "é" is two byte-level tokens: each half alone is not text
    assert body["tokens"] == [107, 198, 172] and body["token_strs"] == ["h", "\ufffd", "\ufffd"]
    assert client.post("/tokenize", json={"prompt": "hi", "return_token_strs": None}).get_json()[
        "token_strs"] is None


def test_the_llama_server_form_is_unchanged(client):
    assert client.post("/tokenize", json={"content": "hi"}).get_json() == {"tokens": [107, 108]}
    # a null field of the other form asks for nothing
    assert client.post("/tokenize", json={"content": "hi", "prompt": None}).get_json() == {
        "tokens": [107, 108]}


# ---- POST /tokenize: vLLM's chat form ----------------------------------------------------------


def _chat_prompt_tokens(client, engine: FakeEngine, body: dict[str, Any]) -> list[int]:
    """The tokens a chat request with ``body`` would generate from (BOS left out)."""
    client.post("/v1/chat/completions", json={**body, "max_tokens": 1})
    prompt = engine.requests[-1].prompt
    return engine.prompt_tokens(GenerationRequest(prompt, add_bos=False))


def test_messages_form_is_the_chat_requests_prompt(client, engine):
    body = client.post("/tokenize", json={"messages": MSGS}).get_json()
    assert body["tokens"] == _chat_prompt_tokens(client, engine, {"messages": MSGS})
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    text = bytes(t - 3 for t in body["tokens"] if t >= 3).decode()
    assert text.endswith("<|assistant|>") and "Be brief." in text
    # the template's own "</s>" is the control token (whether message text is kept text is
    # the chat path's rule, the same here: see the e2e test, whose model has control tokens)
    assert body["tokens"].count(2) == 2 and "hi " in text


def test_messages_form_options(client, engine):
    full = client.post("/tokenize", json={"messages": MSGS}).get_json()["tokens"]
    bare = client.post("/tokenize", json={"messages": MSGS, "add_generation_prompt": False})
    bare_tokens = bare.get_json()["tokens"]
    assert full[:len(bare_tokens)] == bare_tokens and len(full) > len(bare_tokens)
    bos = client.post("/tokenize", json={"messages": MSGS, "add_special_tokens": True}).get_json()
    assert bos["tokens"] == [1, *full]
    strs = client.post("/tokenize", json={"messages": MSGS, "return_token_strs": True}).get_json()
    assert len(strs["token_strs"]) == len(full) and strs["token_strs"][0] == "<"


def test_messages_form_with_tools_and_template_kwargs(client, engine):
    body = {"messages": MSGS, "tools": [TOOL]}
    tokens = client.post("/tokenize", json=body).get_json()["tokens"]
    assert tokens == _chat_prompt_tokens(client, engine, body)


@pytest.mark.parametrize("body, param", [
    ({}, "content"),
    ({"add_special_tokens": True}, "content"),
    ({"content": "a", "prompt": "b"}, "prompt"),
    ({"prompt": "a", "messages": MSGS}, "messages"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "a", "with_pieces": True}, "with_pieces"),
    ({"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": MSGS, "chat_template": "{{ 1 }}"}, "chat_template"),
    ({"messages": MSGS, "continue_final_message": True}, "continue_final_message"),
    ({"messages": MSGS, "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs"),
    ({"messages": MSGS, "tools": [{"type": "web"}]}, "tools.0"),
    ({"messages": MSGS, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
])
def test_bad_bodies_are_400s_naming_the_field(client, body, param):
    err = error(client.post("/tokenize", json=body), 400, param)
    assert err["type"] == "invalid_request_error"
    if not body or param == "content":
        assert "content" in err["message"] and "prompt" in err["message"]


def test_the_chat_templates_hint(client):
    err = error(client.post("/tokenize", json={"messages": MSGS, "chat_template": "x"}), 400)
    assert "CHAT_TEMPLATE" in err["message"]


def test_strict_model_name_applies_to_both_forms():
    client = make_client(FakeEngine(aliases=("smol",)), strict_model_name=True)
    for body in ({"prompt": "hi", "model": "gpt-5"}, {"messages": MSGS, "model": "gpt-5"},
                 {"content": "hi", "model": "gpt-5"}):
        assert error(client.post("/tokenize", json=body), 404, "model")["code"] == "model_not_found"
    assert client.post("/tokenize", json={"prompt": "hi", "model": "smol"}).status_code == 200
    assert client.post("/tokenize", json={"messages": MSGS, "model": "smol"}).status_code == 200


def test_api_keys_guard_the_new_routes():
    client = make_client(FakeEngine(), api_key="k1")
    for method, path, body in (("get", "/tokenizer_info", None),
                               ("post", "/tokenize", {"prompt": "hi"}),
                               ("post", "/tokenize", {"messages": MSGS}),
                               ("post", "/detokenize", {"tokens": [107]})):
        call = getattr(client, method)
        kw = {"json": body} if body is not None else {}
        assert error(call(path, **kw), 401)["code"] == "invalid_api_key"
        ok = call(path, headers={"Authorization": "Bearer k1"}, **kw)
        assert ok.status_code == 200, (path, ok.get_data(as_text=True))


def test_tokenizing_while_loading_is_503():
    client = make_client(FakeEngine(ready=False))
    for body in ({"prompt": "hi"}, {"messages": MSGS}):
        assert error(client.post("/tokenize", json=body), 503)["code"] == "model_loading"


# ---- POST /detokenize --------------------------------------------------------------------------


def test_detokenize_answers_both_names(client):
    tokens = client.post("/tokenize", json={"prompt": "Grüße </s>",
                                            "add_special_tokens": False}).get_json()["tokens"]
    assert client.post("/detokenize", json={"tokens": tokens}).get_json() == {
        "content": "Grüße </s>", "prompt": "Grüße </s>"}
    err = error(client.post("/detokenize", json={"tokens": [300]}), 400, "tokens")
    assert "not in the vocabulary" in err["message"]
