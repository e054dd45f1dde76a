"""End to end: the Responses API of a real server with the real default model, driven by the
official openai SDK (unmodified) and by the OpenAI Agents SDK."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
import requests
from pydantic import BaseModel

from tests.support.responses import check_stream
from tests.support.server import ServerProcess, running_server

GREEDY = {"temperature": 0, "max_output_tokens": 24}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True,
}


@pytest.fixture(scope="module")
def server(default_model) -> ServerProcess:
    # a loaded test machine can make one grammar step slower than the default guard allows
    with running_server({"STREAM_HEARTBEAT_SECONDS": "0", "GRAMMAR_MAX_STEP_MS": "5000"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=120)


def test_create(client):
    r = client.responses.create(model="m", input="What is the capital of France?",
                                instructions="Answer in one short sentence.", **GREEDY)
    assert r.object == "response" and r.status in {"completed", "incomplete"}
    assert r.output_text.strip()
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 24
    assert r.instructions == "Answer in one short sentence."


def test_stream_with_the_sdk_helper(client, server):
    with client.responses.stream(model="m", input="Say hello.", temperature=0,
                                 max_output_tokens=96) as stream:
        events = list(stream)
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        last = events[-1]
        assert text and last.response.output_text == text
        # the helper hands back a final response only when the answer is complete (OpenAI
        # sends response.incomplete at max_output_tokens, and the helper refuses that one)
        assert last.type in {"response.completed", "response.incomplete"}
        if last.type == "response.completed":
            assert stream.get_final_response().output_text == text
    assert last.response.usage.output_tokens > 0
    # the raw bytes follow every rule of the event stream
    with requests.post(server.url("/v1/responses"), json={"input": "Hi", "stream": True, **GREEDY},
                       timeout=120) as raw:
        assert raw.headers["Content-Type"].startswith("text/event-stream")
        datas = check_stream(raw.text)
    assert datas[-1]["type"] in {"response.completed", "response.incomplete"}


def test_function_call_and_its_output(client):
    r = client.responses.create(model="m", input="What is the weather in Paris?", tools=[WEATHER],
                                tool_choice="required", temperature=0, max_output_tokens=64)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls, r.output
    call = calls[0]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments), dict)
    follow = client.responses.create(
        model="m", previous_response_id=r.id, tools=[WEATHER], **GREEDY,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
    )
    # the continuation's prompt holds the call and its result
    assert follow.status in {"completed", "incomplete"} and follow.previous_response_id == r.id
    assert follow.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens
    # the same round trip with the items sent back whole
    again = client.responses.create(
        model="m", tools=[WEATHER], store=False, **GREEDY,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
    )
    assert again.status in {"completed", "incomplete"} and again.store is False


def test_structured_output(client):
    class City(BaseModel):
        name: str
        country: str

    r = client.responses.parse(model="m", input="Give the capital of France as JSON.",
                               text_format=City, temperature=0, max_output_tokens=64)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, City)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"], "additionalProperties": False}
    raw = client.responses.create(model="m", input="What is 2 + 2?", temperature=0, max_output_tokens=32,
                                  text={"format": {"type": "json_schema", "name": "sum", "schema": schema,
                                                   "strict": True}})
    assert isinstance(json.loads(raw.output_text)["answer"], int)


def test_previous_response_id_and_retrieval(client):
    first = client.responses.create(model="m", input="My name is Ada.", **GREEDY)
    second = client.responses.create(model="m", input="What is my name?",
                                     previous_response_id=first.id, **GREEDY)
    assert second.previous_response_id == first.id
    # the continuation's prompt holds the whole first exchange
    alone = client.responses.input_tokens.count(model="m", input="What is my name?")
    assert second.usage.input_tokens > alone.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", input="x", previous_response_id="resp_gone", **GREEDY)


def test_input_tokens_match_the_run(client):
    body = {"input": "Count my tokens, please.", "instructions": "Be brief."}
    counted = client.responses.input_tokens.count(model="m", **body)
    r = client.responses.create(model="m", **body, **GREEDY)
    assert counted.input_tokens == r.usage.input_tokens > 0


def test_the_agents_sdk(server):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return f"Sunny in {city}."

    async def run() -> tuple[object, object, str]:
        aclient = openai.AsyncOpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)
        model = OpenAIResponsesModel(model="m", openai_client=aclient)
        settings = ModelSettings(temperature=0, max_tokens=256)
        try:
            # the tiny model is made to call the tool; its result is the answer
            tool_agent = Agent(
                name="weather", instructions="Use the tool to answer.", model=model,
                tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                model_settings=settings.resolve(ModelSettings(tool_choice="required")),
            )
            with_tool = await Runner.run(tool_agent, "What is the weather in Paris?", max_turns=3)
            # openai-agents >= 0.24 raises on an incomplete response (max_output_tokens): an
            # instruction this model follows to an end (with "Answer briefly." it rambles on
            # in French about France's capital)
            plain = Agent(name="plain", instructions="Answer in one short English sentence.",
                          model=model, model_settings=settings)
            answer = await Runner.run(plain, "What is the capital of France?", max_turns=1)
            streamed = Runner.run_streamed(plain, "Name a colour.", max_turns=1)
            deltas = [e.data.delta async for e in streamed.stream_events()
                      if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"]
            assert "".join(deltas) == streamed.final_output
            return with_tool, answer, streamed.final_output
        finally:
            await aclient.close()

    with_tool, answer, streamed = asyncio.run(run())
    assert seen and with_tool.final_output == f"Sunny in {seen[0]}."
    assert isinstance(answer.final_output, str) and answer.final_output.strip()
    assert streamed.strip()
