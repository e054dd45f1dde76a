"""End to end with the real default model: Ollama's API through its own Python client and
LangChain's ChatOllama, unmodified but for the host: chat (whole and streamed), generate, a tool
call and its result sent back, a JSON schema reply, embed, the model list and details, and the
counters measured. The in-process tier (fake engine) is tests/app/test_ollama.py."""

from __future__ import annotations

import json
import os

import ollama
import pytest
import requests

from tests.support.server import running_server

ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 24}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def srv(default_model):
    with running_server({"PARALLEL": "2", "SERVED_MODEL_NAME": "smol", "EMBEDDINGS": "on"}) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return ollama.Client(host=srv.base)


def test_chat_whole_and_streamed(client):
    whole = client.chat(model="smol", messages=ASK, options=GREEDY)
    assert whole.message.role == "assistant" and whole.message.content.strip()
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.prompt_eval_count > 10 and 0 < whole.eval_count <= 24
    assert whole.total_duration >= whole.eval_duration > 0
    parts = list(client.chat(model="smol", messages=ASK, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content  # greedy: same
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert parts[-1].eval_count == whole.eval_count


def test_generate_and_raw(client):
    got = client.generate(model="smol:latest", prompt="Name a colour.", options=GREEDY)
    assert got.response.strip() and got.model == "smol:latest"
    raw = client.generate(model="smol", prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 3})
    assert raw.response.strip() and raw.prompt_eval_count == 5  # no template around it


def test_a_tool_call_and_its_result(client):
    first = client.chat(model="smol", messages=[{"role": "user", "content":
                                                 "What is the weather in Paris?"}],
                        tools=[WEATHER], options={"temperature": 0, "num_predict": 64})
    calls = first.message.tool_calls or []
    if not calls:  # the tiny model may answer in words; force the call as a client can
        pytest.skip("the model answered without a call")
    assert calls[0].function.name == "get_weather"
    assert isinstance(calls[0].function.arguments, dict)
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               first.message.model_dump(exclude_none=True),
               {"role": "tool", "content": "sunny, 21C", "tool_name": "get_weather"}]
    second = client.chat(model="smol", messages=history, tools=[WEATHER], options=GREEDY)
    assert second.done


def test_a_schema_holds_the_reply(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "country": {"type": "string"}},
              "required": ["city", "country"]}
    got = client.chat(model="smol", messages=ASK, format=schema,
                      options={"temperature": 0, "num_predict": 64})
    value = json.loads(got.message.content)
    assert set(value) == {"city", "country"}


def test_embed(client):
    got = client.embed(model="smol", input=["a cat", "a dog", "a cat"])
    assert len(got.embeddings) == 3 and got.embeddings[0] == got.embeddings[2]
    assert got.embeddings[0] != got.embeddings[1] and got.prompt_eval_count > 0


def test_the_model_routes(client, srv):
    listed = client.list().models
    assert [m.model for m in listed] == ["smol:latest"]
    details = listed[0].details
    assert (details.format, details.family, details.quantization_level) == ("gguf", "llama",
                                                                          "Q4_1")
    shown = client.show("smol")
    assert "tools" in shown.capabilities and "embedding" in shown.capabilities
    assert shown.modelinfo["llama.context_length"] == 8192
    assert client.ps().models[0].model == "smol:latest"
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("llama3")
    assert err.value.status_code == 501
    assert requests.get(srv.url("/api/version"), timeout=10).json()["version"]


def test_langchain_chat_ollama(srv):
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model="smol", base_url=srv.base, temperature=0, num_predict=16)
    reply = llm.invoke("Say hello.")
    assert reply.content.strip()
    chunks = list(llm.stream("Say hello."))
    assert "".join(c.content for c in chunks) == reply.content


def test_litellm_ollama_chat(srv):
    """LiteLLM's ollama_chat provider (it sends no Content-Type: Ollama's routes read it)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its price table: no network
    import litellm

    base = {"model": "ollama_chat/smol", "api_base": srv.base, "temperature": 0,
            "max_tokens": 12, "messages": [{"role": "user", "content": "Say hi"}]}
    whole = litellm.completion(**base)
    text = whole.choices[0].message.content
    assert text.strip() and whole.usage.completion_tokens <= 12
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       litellm.completion(**base, stream=True))
    assert streamed == text
