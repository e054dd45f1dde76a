"""End to end with the real default model: the Gemini API through the Google Gen AI SDK,
LangChain's ChatGoogleGenerativeAI and LiteLLM's gemini/ provider, unmodified but for the base
URL: generate (whole and streamed, the same greedy text), a function call and its response sent
back, a JSON schema reply, count tokens against the prompt a generation reports, embed, the
model list; and the Vertex AI publisher path. The in-process tier: tests/app/test_gemini.py."""

from __future__ import annotations

import json
import os

import pytest
import requests
from google import genai
from google.genai import types

from tests.support.server import running_server

KEY = "sk-gemini-test"
GREEDY = types.GenerateContentConfig(temperature=0, max_output_tokens=24)
WEATHER = types.Tool(function_declarations=[types.FunctionDeclaration(
    name="get_weather", description="The weather in a city",
    parameters=types.Schema(type="OBJECT", properties={"city": types.Schema(type="STRING")},
                            required=["city"]))])


@pytest.fixture(scope="module")
def srv(default_model):
    env = {"PARALLEL": "2", "SERVED_MODEL_NAME": "smol", "EMBEDDINGS": "on", "API_KEY": KEY}
    with running_server(env) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv):
    return genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=srv.base))


def test_generate_whole_and_streamed(client):
    whole = client.models.generate_content(model="smol", contents="Name a colour.",
                                           config=GREEDY)
    assert whole.text.strip() and whole.candidates[0].finish_reason in ("STOP", "MAX_TOKENS")
    use = whole.usage_metadata
    assert use.prompt_token_count > 5 and 0 < use.candidates_token_count <= 24
    streamed = list(client.models.generate_content_stream(model="smol",
                                                          contents="Name a colour.",
                                                          config=GREEDY))
    assert "".join(c.text or "" for c in streamed) == whole.text
    assert streamed[-1].usage_metadata.candidates_token_count == use.candidates_token_count
    counted = client.models.count_tokens(model="smol", contents="Name a colour.")
    assert counted.total_tokens == use.prompt_token_count


def test_a_function_call_and_its_response(client):
    forced = types.GenerateContentConfig(
        tools=[WEATHER], temperature=0, max_output_tokens=64,
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode="ANY")),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    first = client.models.generate_content(model="smol", contents="Weather in Paris?",
                                           config=forced)
    call = first.function_calls[0]
    assert call.name == "get_weather" and isinstance(call.args.get("city"), str)
    history = [types.Content(role="user", parts=[types.Part(text="Weather in Paris?")]),
               first.candidates[0].content,
               types.Content(role="user", parts=[types.Part.from_function_response(
                   name="get_weather", response={"result": "sunny, 21C"})])]
    second = client.models.generate_content(
        model="smol", contents=history,
        config=types.GenerateContentConfig(tools=[WEATHER], temperature=0,
                                           max_output_tokens=32))
    assert second.candidates[0].finish_reason in ("STOP", "MAX_TOKENS")


def test_a_schema_holds_the_reply(client):
    got = client.models.generate_content(
        model="smol", contents="Where is the Eiffel Tower?",
        config=types.GenerateContentConfig(
            temperature=0, max_output_tokens=64, response_mime_type="application/json",
            response_schema=types.Schema(type="OBJECT", properties={
                "city": types.Schema(type="STRING")}, required=["city"])))
    assert set(json.loads(got.text)) == {"city"}


def test_embed_and_models(client):
    got = client.models.embed_content(model="smol", contents=["a cat", "a dog", "a cat"])
    values = [e.values for e in got.embeddings]
    assert values[0] == values[2] and values[0] != values[1]
    assert [m.name for m in client.models.list()] == ["models/smol"]


def test_the_vertex_publisher_path(srv):
    url = srv.url("/v1/projects/p/locations/us-central1/publishers/google/models/smol"
                  ":generateContent")
    resp = requests.post(url, headers={"x-goog-api-key": KEY}, timeout=60, json={
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
        "generationConfig": {"maxOutputTokens": 4}})
    assert resp.status_code == 200 and resp.json()["candidates"][0]["content"]["role"] == "model"
    assert requests.post(url, json={}, timeout=10).status_code == 401


def test_langchain_and_litellm(srv):
    from langchain_google_genai import ChatGoogleGenerativeAI

    llm = ChatGoogleGenerativeAI(model="smol", google_api_key=KEY, base_url=srv.base,
                                 temperature=0, max_output_tokens=12)
    reply = llm.invoke("Say hello.")
    assert reply.content.strip()
    assert "".join(c.content for c in llm.stream("Say hello.")) == reply.content
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its price table: no network
    import litellm

    got = litellm.completion(model="gemini/smol", api_base=f"{srv.base}/v1beta", api_key=KEY,
                             temperature=0, max_tokens=12,
                             messages=[{"role": "user", "content": "Say hello."}])
    assert got.choices[0].message.content.strip()
