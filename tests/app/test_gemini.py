"""The Gemini API over the fake engine, read by the Google Gen AI SDK in process (unmodified but
for its base URL): generate, stream (SSE and the JSON array), count tokens, a function call and
its response sent back, JSON output, thoughts, candidates, embed, the model list; the Vertex AI
paths; fields in either spelling, ignored and refused ones; Google's error shape; API keys in
x-goog-api-key; the predict route. The real model: tests/e2e/test_gemini.py."""

from __future__ import annotations

import json

import httpx
import pytest
from google import genai
from google.genai import errors, types

from app.engine.fake import FakeEngine
from app.engine.fake_embed import FakeEmbedder
from app.engine.types import PROTECT_CLOSE, PROTECT_OPEN
from tests.support.app import make_client

MODEL = "fake-model"
WORDS = "Hello from the fake engine. It speaks in short words."
CALL_REPLY = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
WEATHER = types.FunctionDeclaration(
    name="get_weather", description="The weather in a city",
    parameters=types.Schema(type="OBJECT", properties={"city": types.Schema(type="STRING")},
                            required=["city"]))
BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
PATH = f"/v1beta/models/{MODEL}:generateContent"


def sdk(engine: FakeEngine, **settings) -> genai.Client:
    flask = make_client(engine, **settings)

    def handle(req: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in req.headers.items()
                   if k.lower() not in ("host", "content-length")}
        resp = flask.open(req.url.path, method=req.method, data=req.content, headers=headers,
                          query_string=req.url.query.decode())
        return httpx.Response(resp.status_code, headers=list(resp.headers.items()),
                              content=resp.get_data())

    return genai.Client(api_key="k", http_options=types.HttpOptions(
        base_url="http://test", httpx_client=httpx.Client(transport=httpx.MockTransport(handle))))


def text_of(prompt: str) -> str:
    return prompt.replace(PROTECT_OPEN, "").replace(PROTECT_CLOSE, "")


def test_generate_and_stream():
    engine = FakeEngine()
    client = sdk(engine)
    resp = client.models.generate_content(
        model=MODEL, contents="hi", config=types.GenerateContentConfig(
            system_instruction="Be brief.", temperature=0.3, top_k=5, max_output_tokens=50,
            stop_sequences=["zzz"], seed=7))
    assert resp.text == WORDS and resp.candidates[0].finish_reason == "STOP"
    assert resp.usage_metadata.candidates_token_count == 11 and resp.model_version == MODEL
    p = engine.requests[-1].params
    assert (p.temperature, p.top_k, p.max_tokens, p.stop, p.seed) == (0.3, 5, 50, ("zzz",), 7)
    assert "Be brief." in text_of(engine.requests[-1].prompt)
    chunks = list(client.models.generate_content_stream(model=MODEL, contents="hi"))
    assert "".join(c.text or "" for c in chunks) == WORDS
    assert chunks[-1].usage_metadata.total_token_count > 11
    assert chunks[-1].candidates[0].finish_reason == "STOP"
    short = client.models.generate_content(
        model=MODEL, contents="hi", config=types.GenerateContentConfig(max_output_tokens=2))
    assert short.text == "Hello from " and short.candidates[0].finish_reason == "MAX_TOKENS"


def test_the_stream_without_alt_sse_is_one_json_array():
    resp = make_client(FakeEngine()).post(f"/v1beta/models/{MODEL}:streamGenerateContent",
                                          json=BODY)
    assert resp.headers["Content-Type"].startswith("application/json")
    chunks = json.loads(resp.get_data(as_text=True))
    assert "".join(p["text"] for c in chunks for cand in c["candidates"]
                   for p in cand["content"]["parts"]) == WORDS
    sse = make_client(FakeEngine()).post(
        f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", json=BODY)
    assert sse.headers["Content-Type"].startswith("text/event-stream")
    assert "[DONE]" not in sse.get_data(as_text=True)


def test_count_tokens():
    got = sdk(FakeEngine()).models.count_tokens(model=MODEL, contents="one two three")
    assert got.total_tokens > 0
    wrapped = make_client(FakeEngine()).post(f"/v1beta/models/{MODEL}:countTokens", json={
        "generateContentRequest": {"model": f"models/{MODEL}", **BODY}}).get_json()
    plain = make_client(FakeEngine()).post(f"/v1beta/models/{MODEL}:countTokens",
                                           json=BODY).get_json()
    assert wrapped == plain and plain["totalTokens"] > 0


def test_a_function_call_and_its_response():
    engine = FakeEngine(reply=CALL_REPLY)
    client = sdk(engine)
    tool = types.Tool(function_declarations=[WEATHER])
    resp = client.models.generate_content(
        model=MODEL, contents="Weather in Paris?", config=types.GenerateContentConfig(
            tools=[tool], automatic_function_calling=types.AutomaticFunctionCallingConfig(
                disable=True)))
    call = resp.function_calls[0]
    assert call.name == "get_weather" and call.args == {"city": "Paris"}
    engine.reply = '{"response": "Sunny."}'  # the generic format's answer
    history = [types.Content(role="user", parts=[types.Part(text="Weather in Paris?")]),
               resp.candidates[0].content,
               types.Content(role="user", parts=[types.Part.from_function_response(
                   name="get_weather", response={"result": "sunny, 21C"})])]
    again = client.models.generate_content(
        model=MODEL, contents=history, config=types.GenerateContentConfig(tools=[tool]))
    assert again.text == "Sunny."
    prompt = text_of(engine.requests[-1].prompt)
    assert "sunny, 21C" in prompt and '"city": "Paris"' in prompt
    assert engine.requests[-2].params.grammar is not None  # the declaration's schema held it
    forced = client.models.generate_content(
        model=MODEL, contents="x", config=types.GenerateContentConfig(
            tools=[tool], tool_config=types.ToolConfig(function_calling_config=
                types.FunctionCallingConfig(mode="ANY"))))
    assert forced is not None and engine.requests[-1].params.grammar_triggers == ()


def test_json_output():
    engine = FakeEngine(reply='{"city": "Paris"}')
    resp = sdk(engine).models.generate_content(
        model=MODEL, contents="x", config=types.GenerateContentConfig(
            response_mime_type="application/json",
            response_schema=types.Schema(type="OBJECT", properties={
                "city": types.Schema(type="STRING")}, required=["city"])))
    assert json.loads(resp.text) == {"city": "Paris"}
    assert "city" in engine.requests[-1].params.grammar


def test_thoughts():
    engine = FakeEngine(reply="<think>Short.</think>Hi.")
    client = sdk(engine, reasoning_format="parsed")
    hidden = client.models.generate_content(model=MODEL, contents="x")
    assert hidden.text == "Hi." and len(hidden.candidates[0].content.parts) == 1
    shown = client.models.generate_content(
        model=MODEL, contents="x", config=types.GenerateContentConfig(
            thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_budget=64)))
    parts = shown.candidates[0].content.parts
    assert (parts[0].thought, parts[0].text, parts[1].text) == (True, "Short.", "Hi.")
    assert shown.usage_metadata.thoughts_token_count > 0


def test_candidates():
    resp = sdk(FakeEngine()).models.generate_content(
        model=MODEL, contents="x", config=types.GenerateContentConfig(candidate_count=2))
    assert [c.index for c in resp.candidates] == [0, 1]
    assert resp.candidates[1].content.parts[0].text.startswith("Hello Hello")


def test_embed():
    engine = FakeEngine()
    engine.embedder = FakeEmbedder()  # type: ignore[attr-defined]
    client = sdk(engine)
    one = client.models.embed_content(model=MODEL, contents="a cat")
    many = client.models.embed_content(model=MODEL, contents=["a cat", "a dog"])
    assert len(many.embeddings) == 2 and many.embeddings[0].values == one.embeddings[0].values
    short = client.models.embed_content(model=MODEL, contents="a cat", config=types.
                                        EmbedContentConfig(output_dimensionality=4))
    assert len(short.embeddings[0].values) == 4


def test_the_model_list_and_vertex_paths():
    client = sdk(FakeEngine(aliases=("smol", "gemini-2.5-flash")))
    assert [m.name for m in client.models.list()] == ["models/smol", "models/gemini-2.5-flash"]
    assert client.models.get(model="gemini-2.5-flash").input_token_limit == 512
    flask = make_client(FakeEngine())
    vertex = flask.post(f"/v1/projects/p/locations/us-central1/publishers/google/models/{MODEL}"
                        ":generateContent", json=BODY)
    assert vertex.status_code == 200
    assert vertex.get_json()["candidates"][0]["content"]["parts"][0]["text"] == WORDS
    assert flask.get("/v1/models").get_json()["object"] == "list"  # OpenAI's without the header


@pytest.mark.parametrize("body, field", [
    ({**BODY, "cachedContent": "cachedContents/1"}, "cachedContent"),
    ({**BODY, "generationConfig": {"responseLogprobs": True}}, "generationConfig.responseLogprobs"),
    ({**BODY, "generationConfig": {"temperature": 3}}, "generationConfig.temperature"),
    ({**BODY, "generationConfig": {"responseModalities": ["IMAGE"]}},
     "generationConfig.responseModalities"),
    ({**BODY, "tools": [{"googleSearch": {}}]}, "tools.0.googleSearch"),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png",
                                                              "data": "aGk="}}]}]},
     "no vision projector"),  # the server's model reads text only
    ({"contents": [{"role": "model", "parts": [{"inlineData": {"mimeType": "image/png",
                                                               "data": "AAAA"}}]}]},
     "contents.0.parts.0.inlineData: images come in a user turn"),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "application/pdf",
                                                              "data": "AAAA"}}]}]},
     "takes images, video and WAV audio only"),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "video/mp4",
                                                              "data": "AAAA"}}]}]},
     "reads no video"),  # the server's model reads text only
    ({"contents": []}, "contents"),
    ({**BODY, "frobnicate": 1}, "frobnicate"),
])
def test_bad_requests_in_googles_shape(body, field):
    resp = make_client(FakeEngine()).post(PATH, json=body)
    assert resp.status_code == 400
    err = resp.get_json()["error"]
    assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT" and field in err["message"]
    with pytest.raises(errors.ClientError) as sdk_err:  # the SDK raises Google's error
        sdk(FakeEngine()).models.generate_content(
            model=MODEL, contents="x", config=types.GenerateContentConfig(temperature=3))
    assert sdk_err.value.code == 400 and sdk_err.value.status == "INVALID_ARGUMENT"


def test_either_spelling_and_ignored_fields():
    engine = FakeEngine()
    resp = make_client(engine).post(PATH, json={
        "contents": BODY["contents"], "safety_settings": [{"category": "X", "threshold": "Y"}],
        "generation_config": {"max_output_tokens": 3, "top_p": 0.5},
        "labels": {"team": "a"}})
    assert resp.status_code == 200
    assert (engine.requests[-1].params.max_tokens, engine.requests[-1].params.top_p) == (3, 0.5)


def test_api_keys_in_googles_header():
    client = make_client(FakeEngine(), api_key="sekrit")
    assert client.post(PATH, json=BODY).status_code == 401
    assert client.post(PATH, json=BODY, headers={"x-goog-api-key": "sekrit"}).status_code == 200
    assert client.post(PATH + "?key=sekrit", json=BODY).status_code == 401  # never a query


def test_the_predict_route():
    flask = make_client(FakeEngine())
    env = flask.post("/predict", json={"instances": [{"@requestFormat": "gemini", **BODY}]})
    assert env.get_json()["predictions"][0]["candidates"][0]["finishReason"] == "STOP"
    raw = flask.post("/predict", json=BODY)
    assert raw.get_json()["candidates"][0]["content"]["role"] == "model"


@pytest.mark.parametrize("meta, clip", [
    ({"startOffset": "1.5s", "endOffset": "4s", "fps": 2}, (1.5, 4.0, 2.0)),
    ({"start_offset": "2s"}, (2.0, None, None)),
    (None, None),
])
def test_video_metadata_is_the_clip_taken(meta, clip):
    from app.api.gemini import parsing
    from app.core.media import Collected

    take = Collected(1 << 20, 1 << 20)
    part = {"inlineData": {"mimeType": "video/mp4", "data": "AAAA"}}
    if meta is not None:
        part["videoMetadata"] = meta
    parsing.messages([{"role": "user", "parts": [part]}], take)
    (item,) = take.items
    assert item.kind == "video"
    got = item.clip and (item.clip.start, item.clip.end, item.clip.fps)
    assert got == clip


@pytest.mark.parametrize("meta, field", [
    ({"fps": 0}, "videoMetadata.fps"), ({"fps": 25}, "videoMetadata.fps"),
    ({"startOffset": "soon"}, "videoMetadata.startOffset"),
    ({"startOffset": "3s", "endOffset": "2s"}, "videoMetadata.endOffset"),
])
def test_bad_video_metadata_is_a_400_naming_it(meta, field):
    body = {"contents": [{"role": "user", "parts": [
        {"inlineData": {"mimeType": "video/mp4", "data": "AAAA"}, "videoMetadata": meta}]}]}
    resp = make_client(FakeEngine()).post(PATH, json=body)
    assert resp.status_code == 400
    assert field in resp.get_json()["error"]["message"]
