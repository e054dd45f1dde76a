"""End to end: the official anthropic SDK, unmodified, and pydantic-ai's Anthropic model against a
real server with the real default model (Messages API)."""

from __future__ import annotations

import anthropic
import pytest
import requests

from tests.support.clients import pydantic_ai_streamed_sum
from tests.support.server import running_server

ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # the SDK has no sampling arguments of its own: sent as extra_body
ADD = {"name": "add_two_numbers", "description": "Add two integers", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}


@pytest.fixture(scope="module")
def srv(default_model):
    with running_server({"PARALLEL": "2", "STREAM_HEARTBEAT_SECONDS": "0"}) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(srv):
    return anthropic.Anthropic(base_url=srv.url(""), api_key="x", max_retries=0)


def test_create(sdk):
    msg = sdk.messages.create(model="m", max_tokens=16, messages=ASK, system="Answer briefly.",
                              extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.content[0].type == "text" and msg.content[0].text.strip()
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert 0 < msg.usage.output_tokens <= 16 and msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 0


def test_stream_matches_create(sdk):
    with sdk.messages.stream(model="m", max_tokens=12, messages=ASK, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens <= 12
    again = sdk.messages.create(model="m", max_tokens=12, messages=ASK, extra_body=GREEDY)
    assert again.content[0].text == text  # greedy: the same answer streamed or not


def test_stop_sequence(sdk):
    msg = sdk.messages.create(model="m", max_tokens=32, messages=ASK, stop_sequences=["Paris"],
                              extra_body=GREEDY)
    if msg.stop_reason == "stop_sequence":  # the model said it
        assert msg.stop_sequence == "Paris" and "Paris" not in msg.content[0].text
    else:
        assert msg.stop_sequence is None


def test_forced_tool_use_and_tool_result_round_trip(sdk):
    ask = [{"role": "user", "content": "What is 3 plus 4?"}]
    with sdk.messages.stream(model="m", max_tokens=64, tools=[ADD], messages=ask, extra_body=GREEDY,
                             tool_choice={"type": "tool", "name": "add_two_numbers"}) as stream:
        called = stream.get_final_message()
    assert called.stop_reason == "tool_use"
    (call,) = [b for b in called.content if b.type == "tool_use"]
    assert call.name == "add_two_numbers" and set(call.input) == {"a", "b"}
    assert call.id.startswith("toolu_")
    ask += [{"role": "assistant", "content": called.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "7"}]}]
    answer = sdk.messages.create(model="m", max_tokens=24, tools=[ADD], messages=ask, extra_body=GREEDY,
                                 tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"]
    # any: at least one call; one at most without parallel calls (a tiny model repeats its call)
    one = sdk.messages.create(model="m", max_tokens=64, tools=[ADD], messages=ask[:1], extra_body=GREEDY,
                              tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert one.stop_reason == "tool_use"
    assert [(b.type, b.name) for b in one.content] == [("tool_use", "add_two_numbers")]


def test_count_tokens_is_the_prompt_as_used(sdk):
    kwargs = {"model": "m", "messages": ASK, "system": "Answer briefly.", "tools": [ADD]}
    counted = sdk.messages.count_tokens(**kwargs)
    used = sdk.messages.create(max_tokens=1, extra_body=GREEDY, **kwargs).usage
    assert counted.input_tokens == used.input_tokens + used.cache_read_input_tokens
    assert sdk.messages.count_tokens(model="m", messages=ASK).input_tokens < counted.input_tokens


def test_bad_request_is_an_sdk_error(sdk):
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model="m", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}])
    assert bad.value.status_code == 400
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in bad.value.body["error"]["message"]


def test_raw_http_stream_events(srv):
    body = {"max_tokens": 6, "messages": ASK, "stream": True, "temperature": 0}
    with requests.post(srv.url("/v1/messages"), json=body, stream=True, timeout=60,
                       headers={"anthropic-version": "2023-06-01", "x-api-key": "x"}) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        names = [ln[7:] for ln in r.iter_lines(decode_unicode=True) if ln.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_pydantic_ai_agent_with_an_output_tool(srv):
    """pydantic-ai's own Anthropic model: a structured output is a forced tool call, streamed."""
    _, calls = pydantic_ai_streamed_sum(srv.url(""), api="anthropic")
    assert calls == {"final_result"}


def test_error_mid_stream_raises_in_the_sdk(server_factory):
    """A generation past REQUEST_TIMEOUT ends its stream with an ``event: error``, which the SDK
    raises; the server stays healthy. The timeout (1 ms) is over before the engine's first step
    however fast the machine: the request is accepted (the stream has started) and then always
    fails, never finishes first (a 1 s limit let a quiet machine finish the reply in time)."""
    srv2 = server_factory({"REQUEST_TIMEOUT": "0.001", "PARALLEL": "1"})
    srv2.wait_ready()
    sdk2 = anthropic.Anthropic(base_url=srv2.url(""), api_key="x", max_retries=0)
    ask = [{"role": "user", "content": "List the numbers from 1 to 1000, one per line."}]
    got: list[str] = []
    stream = sdk2.messages.stream(model="m", max_tokens=1000, messages=ask, extra_body=GREEDY)
    with pytest.raises(anthropic.APIStatusError) as exc, stream as s:
        got.extend(s.text_stream)
    assert exc.value.status_code == 200  # raised from the stream's error event, not an HTTP error
    assert exc.value.body["type"] == "error" and exc.value.body["error"]["type"] == "timeout_error"
    assert requests.get(srv2.url("/health"), timeout=5).status_code == 200


def test_a_prefill_is_continued(sdk):
    """A final assistant message is the answer's start (opencode sends one): the reply
    continues it, and holds only what follows; the same as the prompt written out."""
    start = "The capital of France is"
    msg = sdk.messages.create(model="m", max_tokens=4, extra_body=GREEDY,
                              messages=[*ASK, {"role": "assistant", "content": start}])
    text = msg.content[0].text
    assert text and not text.startswith(start)
    count = sdk.messages.count_tokens(model="m", messages=[*ASK, {"role": "assistant",
                                                                  "content": start}])
    plain = sdk.messages.count_tokens(model="m", messages=ASK)
    assert count.input_tokens > plain.input_tokens  # the prefill is in the prompt


def test_models_in_anthropics_shape(sdk):
    page = sdk.models.list()
    assert page.data and page.data[0].type == "model"
    assert sdk.models.retrieve(page.data[0].id).id == page.data[0].id
    with pytest.raises(anthropic.NotFoundError):
        sdk.models.retrieve("claude-no-such-model")


def test_an_overflow_is_worded_as_anthropic_words_it(server_factory):
    srv = server_factory({"CTX_SIZE": "512"})
    srv.wait_ready()
    client = anthropic.Anthropic(base_url=srv.url(""), api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="m", max_tokens=8,
                               messages=[{"role": "user", "content": "word " * 700}])
    assert "prompt is too long:" in str(err.value) and "> 512 maximum" in str(err.value)
