"""Ollama's API over the fake engine: chat and generate (NDJSON streams by default, one object
with stream false, the counters), options, format, tools and tool messages, think, embed and
the older embeddings, the model routes, model management refused, errors in Ollama's shape, the
Vertex predict route; and the `ollama` Python client reading all of it in process. The real
model with the real clients: tests/e2e/test_ollama.py."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from app.engine.fake import FakeEngine
from app.engine.fake_embed import FakeEmbedder
from app.engine.types import PROTECT_CLOSE, PROTECT_OPEN
from tests.support.app import make_client

MODEL = "fake-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
WORDS = "Hello from the fake engine. It speaks in short words."
CALL_REPLY = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]


def lines(resp) -> list[dict]:
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.headers["Content-Type"] == "application/x-ndjson"
    return [json.loads(x) for x in resp.get_data(as_text=True).splitlines() if x]


def client_of(engine: FakeEngine, **settings) -> ollama.Client:
    """The official client with its HTTP calls answered by the Flask test client."""
    flask = make_client(engine, **settings)

    def handle(req: httpx.Request) -> httpx.Response:
        resp = flask.open(req.url.path, method=req.method, data=req.content,
                          headers={"Content-Type": "application/json"})
        return httpx.Response(resp.status_code, headers=list(resp.headers.items()),
                              content=resp.get_data())

    return ollama.Client(host="http://test", transport=httpx.MockTransport(handle))


def text_of(prompt: str) -> str:
    return prompt.replace(PROTECT_OPEN, "").replace(PROTECT_CLOSE, "")


# ---- chat and generate -------------------------------------------------------------------------


def test_chat_streams_ndjson_by_default():
    got = lines(make_client(FakeEngine()).post("/api/chat", json=CHAT))
    assert all(x["model"] == MODEL and x["created_at"].endswith("Z") for x in got)
    assert [x["done"] for x in got] == [False] * (len(got) - 1) + [True]
    assert "".join(x["message"]["content"] for x in got) == WORDS
    final = got[-1]
    assert final["done_reason"] == "stop" and final["message"] == {"role": "assistant",
                                                                    "content": ""}
    assert final["prompt_eval_count"] > 0 and final["eval_count"] == 11  # the end token too
    assert final["total_duration"] >= final["prompt_eval_duration"] + final["eval_duration"] - 1
    assert final["load_duration"] == 0 and final["eval_duration"] > 0


def test_chat_whole_and_the_client():
    engine = FakeEngine()
    whole = make_client(engine).post("/api/chat", json={**CHAT, "stream": False}).get_json()
    assert whole["message"] == {"role": "assistant", "content": WORDS} and whole["done"]
    client = client_of(engine)
    resp = client.chat(model=MODEL, messages=CHAT["messages"])
    assert resp.message.content == WORDS and resp.done_reason == "stop"
    assert resp.eval_count == 11 and resp.total_duration > 0
    parts = list(client.chat(model=MODEL, messages=CHAT["messages"], stream=True))
    assert "".join(p.message.content for p in parts) == WORDS and parts[-1].done


def test_generate():
    engine = FakeEngine()
    client = client_of(engine)
    resp = client.generate(model=f"{MODEL}:latest", prompt="hi", system="Be brief.",
                           options={"num_predict": 2})
    assert resp.response == "Hello from " and resp.done_reason == "length"
    assert resp.model == f"{MODEL}:latest"  # the name asked for is echoed
    prompt = text_of(engine.requests[-1].prompt)
    assert "Be brief." in prompt and "<|im_start|>user\nhi" in prompt
    streamed = list(client.generate(model=MODEL, prompt="hi", stream=True))
    assert "".join(p.response for p in streamed) == WORDS
    client.generate(model=MODEL, prompt="As written", raw=True, options={"num_predict": 1})
    assert engine.requests[-1].prompt == "As written"  # raw: no template


def test_options_reach_the_engine():
    engine = FakeEngine()
    client = client_of(engine)
    client.chat(model=MODEL, messages=CHAT["messages"], options={
        "temperature": 0.2, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 42,
        "num_predict": 3, "stop": ["x"], "repeat_penalty": 1.1, "repeat_last_n": 32,
        "num_ctx": 256, "num_gpu": 99, "num_thread": 8})
    p = engine.requests[-1].params
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed, p.max_tokens, p.stop,
            p.repeat_penalty, p.penalty_last_n) == (0.2, 0.5, 7, 0.1, 42, 3, ("x",), 1.1, 32)
    client.chat(model=MODEL, messages=CHAT["messages"], options={"num_predict": -1})
    assert engine.requests[-1].params.max_tokens is None


@pytest.mark.parametrize("body, needle", [
    ({**CHAT, "options": {"num_ctx": 100000}}, "options.num_ctx"),
    ({**CHAT, "options": {"mirostat": 2}}, "options.mirostat"),
    ({**CHAT, "options": {"temprature": 1}}, "options.temprature"),
    ({**CHAT, "options": {"top_k": "many"}}, "options.top_k"),
    ({**CHAT, "template": "{{ .Prompt }}"}, "template"),
    ({**CHAT, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ({**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": CHAT["messages"]}, "model"),
    ({**CHAT, "stream": "yes"}, "stream"),
])
def test_bad_chat_requests_are_400s_in_ollamas_shape(body, needle):
    resp = make_client(FakeEngine()).post("/api/chat", json=body)
    assert resp.status_code == 400
    err = resp.get_json()
    assert set(err) == {"error", "request_id"} and needle in err["error"]


@pytest.mark.parametrize("body, needle", [
    ({"model": MODEL, "prompt": "hi", "context": [1, 2]}, "context"),
    ({"model": MODEL, "prompt": "hi", "suffix": "end"}, "suffix"),
    ({"model": MODEL, "prompt": ""}, "prompt"),
    ({"model": MODEL, "prompt": "hi", "raw": True, "system": "x"}, "system"),
])
def test_bad_generate_requests(body, needle):
    resp = make_client(FakeEngine()).post("/api/generate", json=body)
    assert resp.status_code == 400 and needle in resp.get_json()["error"]


def test_keep_alive_is_accepted():
    resp = make_client(FakeEngine()).post("/api/chat", json={**CHAT, "keep_alive": "5m",
                                                              "stream": False})
    assert resp.status_code == 200


def test_format_holds_the_reply():
    engine = FakeEngine(reply='{"a": 1}')
    client = client_of(engine)
    client.chat(model=MODEL, messages=CHAT["messages"], format="json")
    assert engine.requests[-1].params.grammar is not None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    resp = client.chat(model=MODEL, messages=CHAT["messages"], format=schema)
    assert json.loads(resp.message.content) == {"a": 1}
    assert "a" in engine.requests[-1].params.grammar


def test_tool_calls_whole_and_streamed():
    engine = FakeEngine(reply=CALL_REPLY)
    client = client_of(engine)
    resp = client.chat(model=MODEL, messages=CHAT["messages"], tools=TOOLS)
    call = resp.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    got = lines(make_client(engine).post("/api/chat", json={**CHAT, "tools": TOOLS}))
    with_calls = [x for x in got if x["message"].get("tool_calls")]
    assert len(with_calls) == 1 and not with_calls[0]["done"]
    assert with_calls[0]["message"]["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert got[-1]["done"] and got[-1]["done_reason"] == "stop"


def test_a_tool_result_goes_back_to_its_call():
    engine = FakeEngine(reply='{"response": "It is sunny."}')  # the generic tool format's
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "sunny, 21C", "tool_name": "get_weather"}]
    resp = client_of(engine).chat(model=MODEL, messages=history, tools=TOOLS)
    assert resp.message.content == "It is sunny."
    prompt = text_of(engine.requests[-1].prompt)
    assert "sunny, 21C" in prompt and '"city": "Paris"' in prompt


def test_think():
    engine = FakeEngine(reply="<think>Short.</think>Hi.")
    client = client_of(engine, reasoning_format="parsed")
    resp = client.chat(model=MODEL, messages=CHAT["messages"], think=True)
    assert (resp.message.thinking, resp.message.content) == ("Short.", "Hi.")
    streamed = list(client.chat(model=MODEL, messages=CHAT["messages"], think=True,
                                stream=True))
    assert "".join(p.message.thinking or "" for p in streamed) == "Short."
    gen = client.generate(model=MODEL, prompt="hi", think=True)
    assert (gen.thinking, gen.response) == ("Short.", "Hi.")

    template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "{% if enable_thinking is defined and not enable_thinking %}[no thought]{% endif %}")
    plain = FakeEngine(chat_template=template)
    client_of(plain).chat(model=MODEL, messages=CHAT["messages"], think=False)
    assert text_of(plain.requests[-1].prompt).endswith("[no thought]")
    client_of(plain).chat(model=MODEL, messages=CHAT["messages"])
    assert "[no thought]" not in plain.requests[-1].prompt


# ---- embeddings --------------------------------------------------------------------------------


def embedding_engine() -> FakeEngine:
    engine = FakeEngine()
    engine.embedder = FakeEmbedder()  # type: ignore[attr-defined]
    return engine


def test_embed_and_the_older_embeddings():
    client = client_of(embedding_engine())
    resp = client.embed(model=MODEL, input=["a cat", "a dog"])
    assert len(resp.embeddings) == 2 and len(resp.embeddings[0]) == len(resp.embeddings[1]) > 0
    assert resp.prompt_eval_count and resp.model == MODEL
    one = client.embed(model=MODEL, input="a cat")
    assert one.embeddings[0] == resp.embeddings[0]
    old = client.embeddings(model=MODEL, prompt="a cat")
    assert list(old.embedding) == resp.embeddings[0]
    err = make_client(embedding_engine()).post("/api/embed", json={"model": MODEL, "input": ""})
    assert err.status_code == 400 and "input" in err.get_json()["error"]


# ---- the model routes --------------------------------------------------------------------------


def test_list_show_ps_version():
    client = client_of(FakeEngine(aliases=("smol", "team/smol:v1")))
    names = [m.model for m in client.list().models]
    assert names == ["smol:latest", "team/smol:v1"]
    listed = client.list().models[0]
    assert listed.details.format == "gguf" and listed.details.quantization_level == "Q4_1"
    assert listed.details.parameter_size == "135M" and listed.size > 0
    shown = client.show("smol:latest")
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "llama"
    running = client.ps().models
    assert running[0].model == "smol:latest" and running[0].size_vram == 0
    resp = client.chat(model="smol:latest", messages=CHAT["messages"])
    assert resp.model == "smol:latest"
    flask = make_client(FakeEngine())
    assert flask.get("/api/version").get_json()["version"]
    missing = flask.post("/api/show", json={"model": "nope"})
    assert missing.status_code == 404 and "not found" in missing.get_json()["error"]


@pytest.mark.parametrize("method, path", [
    ("POST", "/api/pull"), ("POST", "/api/push"), ("POST", "/api/create"), ("POST", "/api/copy"),
    ("DELETE", "/api/delete"), ("POST", "/api/blobs/sha256:abc"),
])
def test_model_management_is_refused_clearly(method, path):
    resp = make_client(FakeEngine()).open(path, method=method, json={"model": "x"})
    assert resp.status_code == 501
    assert "serves the one model it was started with" in resp.get_json()["error"]
    with pytest.raises(ollama.ResponseError) as err:
        client_of(FakeEngine()).pull("llama3")
    assert err.value.status_code == 501


# ---- the predict route -------------------------------------------------------------------------


def test_vertex_envelopes_and_raw_bodies():
    client = make_client(FakeEngine())
    env = client.post("/predict", json={"instances": [
        {"@requestFormat": "ollama_chat", **CHAT, "stream": False},
        {"@requestFormat": "ollama_generate", "model": MODEL, "prompt": "hi", "stream": False,
         "options": {"num_predict": 1}}]}).get_json()["predictions"]
    assert env[0]["message"]["content"] == WORDS and env[1]["response"] == "Hello "
    raw = client.post("/predict", json={**CHAT, "options": {"num_predict": 1}})
    got = lines(raw)
    assert got[-1]["done"] and got[0]["message"]["content"] == "Hello "


# ---- content types ------------------------------------------------------------------------------


def test_any_content_type_from_a_non_browser_caller_but_not_from_a_page():
    """LiteLLM's ollama_chat and Ollama's documented `curl -d` lines send no JSON type: read
    them, unless a browser sent them (Origin), which stays held to JSON as on every route."""
    client = make_client(FakeEngine())
    body = json.dumps({**CHAT, "stream": False})
    for kind in (None, "application/x-www-form-urlencoded", "text/plain"):
        resp = client.post("/api/chat", data=body, content_type=kind)
        assert resp.status_code == 200, (kind, resp.get_data(as_text=True))
    page = client.post("/api/chat", data=body, content_type="text/plain",
                       headers={"Origin": "https://elsewhere.example"})
    assert page.status_code == 415 and "Content-Type" in page.get_json()["error"]
    openai_route = client.post("/v1/chat/completions", data=json.dumps(
        {"messages": CHAT["messages"]}), content_type="text/plain")
    assert openai_route.status_code == 415  # only Ollama's routes relax it
