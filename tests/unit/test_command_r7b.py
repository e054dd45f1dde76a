"""Command R7B: detection from its template, the reply scanner on llama.cpp's test replies
(whole, cut at every character, streamed), the history a second and third turn render, and
the thinking switch that closes an empty thought in the prompt."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
from app.formats.command_r7b import COMMAND_R7B_THOUGHT
from app.formats.spec import ReplySpec
from tests.support.family_replies import (
    assert_only_grows,
    assert_random_replies_grow,
    assert_streams_as_whole,
    calls_of,
    whole,
)
from tests.support.server import DATA

TEMPLATE = (DATA / "templates" / "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja").read_text()
FMT = formats.get("command_r7b")
MARKUP = ("<|START_", "<|END_", "START_ACTION", "tool_call_id")
NAMES = frozenset({"special_function", "special_function_with_opt"})
ACTION = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "special_function", '
          '"parameters": {"arg1": 1}}\n]<|END_ACTION|>')

# (reply, content, calls, reasoning)
CASES = [
    ("<|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>", "Hello, world!\nWhat's up?",
     [], None),
    ("<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>Hello, world!\nWhat's up?"
     "<|END_RESPONSE|>", "Hello, world!\nWhat's up?", [], "I'm\nthinking"),
    ("<|START_THINKING|>I'm\nthinking<|END_THINKING|>" + ACTION, "",
     [("special_function", {"arg1": 1})], "I'm\nthinking"),
    ("<|START_THINKING|><|END_THINKING|>" + ACTION, "", [("special_function", {"arg1": 1})], ""),
    ('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "special_function", "parameters": '
     '{"arg1": "a]<|END_ACTION|>"}}, {"tool_call_id": "1", "tool_name": "special_function_with_opt",'
     ' "parameters": {"arg1": 1, "arg2": 2}}]<|END_ACTION|>', "",
     [("special_function", {"arg1": "a]<|END_ACTION|>"}),
      ("special_function_with_opt", {"arg1": 1, "arg2": 2})], None),
    ("<|START_THINKING|>a plan <|START_ACTION|>[] in words<|END_THINKING|><|START_RESPONSE|>"
     "1 < 2<|END_RESPONSE|>", "1 < 2", [], "a plan <|START_ACTION|>[] in words"),
]


def spec(**kw) -> ReplySpec:
    return ReplySpec(format=FMT, think=True, thought=COMMAND_R7B_THOUGHT, names=NAMES, **kw)


def test_detected_from_its_template():
    assert formats.detect(TEMPLATE).name == "command_r7b"
    assert formats.detect_reasoning(TEMPLATE) is COMMAND_R7B_THOUGHT
    summary = formats.summary(TEMPLATE, ("<|START_ACTION|>", "<|END_ACTION|>", "<|START_RESPONSE|>",
                                         "<|END_RESPONSE|>", "<|START_THINKING|>",
                                         "<|END_THINKING|>", "<|END_OF_TURN_TOKEN|>"),
                              "auto", "auto")
    assert summary["tool_format"] == "command_r7b" and summary["thought_format"] == "command_r7b"
    assert summary["drops"] == ["<|END_OF_TURN_TOKEN|>"]


@pytest.mark.parametrize("reply, content, calls, reasoning", CASES)
def test_replies_whole_cut_and_streamed(reply, content, calls, reasoning):
    msg = whole(spec(), reply)
    assert (msg["content"] or "") == content
    assert calls_of(msg) == calls
    assert msg.get("reasoning_content") == reasoning
    assert_streams_as_whole(spec(), reply, MARKUP)
    assert_only_grows(spec(), reply)


def test_a_cut_call_keeps_what_parsed_and_shows_no_markup():
    reply = ('<|START_THINKING|>I\'m\nthinking<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id":'
             ' "0", "tool_name": "special_function", ')
    msg = whole(spec(), reply)
    assert msg["content"] in (None, "") and "tool_calls" not in msg
    assert msg["reasoning_content"] == "I'm\nthinking"


def test_without_tools_the_response_markers_are_dropped_and_no_call_counts():
    bare = ReplySpec(format=FMT, think=True, thought=COMMAND_R7B_THOUGHT)  # names: none offered
    assert whole(bare, "<|START_RESPONSE|>Hi<|END_RESPONSE|>")["content"] == "Hi"
    msg = whole(bare, ACTION)
    assert "tool_calls" not in msg and not msg["content"]


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": "I will look it up.",
     "tool_calls": [{"id": "call_a", "type": "function", "function": {
         "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
                    {"id": "call_b", "type": "function", "function": {
         "name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
    {"role": "assistant", "content": "Sunny in Paris, rain in Oslo."},
    {"role": "user", "content": "And Rome?"},
]


def test_a_third_turn_renders_calls_plans_and_results():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object"}}}]
    extra = COMMAND_R7B_THOUGHT.controls({"tools": tools}, None, None)
    prompt = chat_template.render(TEMPLATE, FMT.history(HISTORY), extra=extra)
    assert '<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>' in prompt
    assert '"tool_name": "get_weather", "parameters": {"city": "Paris"}' in prompt
    assert '"tool_call_id": "1", "tool_name": "get_weather", "parameters": {"city": "Oslo"}' in prompt
    assert '"tool_call_id": "0",\n        "results": {\n            "0": "sunny"' in prompt
    assert '"tool_call_id": "1",\n        "results": {\n            "0": "rain"' in prompt
    assert "<|START_RESPONSE|>Sunny in Paris, rain in Oslo.<|END_RESPONSE|>" in prompt
    assert prompt.endswith("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


def test_thinking_off_closes_an_empty_thought_in_the_prompt():
    """llama.cpp's copy of the template reads enable_thinking (on unless the request says);
    Cohere's own reads nothing, so the prompt gets the empty thought."""
    for thinking, effort, on in ((None, None, True), (True, None, True), (False, None, False),
                                 (None, "none", False), (None, "high", True)):
        extra = COMMAND_R7B_THOUGHT.controls({}, effort, thinking)
        assert extra == {"enable_thinking": on, "reasoning": on}
        rendered = chat_template.render(TEMPLATE, [{"role": "user", "content": "hi"}], extra=extra)
        assert rendered.endswith("<|START_THINKING|><|END_THINKING|>") != on
    assert COMMAND_R7B_THOUGHT.controls({"enable_thinking": True}, None, False) == {
        "enable_thinking": True, "reasoning": False}  # the client's own wins
    prompt = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    assert COMMAND_R7B_THOUGHT.finish_prompt(prompt, False) == (
        prompt + "<|START_THINKING|><|END_THINKING|>")
    assert COMMAND_R7B_THOUGHT.finish_prompt(prompt, True) == prompt
    assert COMMAND_R7B_THOUGHT.finish_prompt(prompt, None) == prompt


MOE = (DATA / "templates" / "Cohere2MoE.jinja").read_text()


def test_cohere2_moe_opens_the_thought_and_answers_between_text_markers():
    """Cohere2 MoE (North Code): the same calls; its prompt opens the thought (``reasoning``
    on) or closes an empty one (off); its answer is between <|START_TEXT|> and <|END_TEXT|>."""
    assert formats.detect(MOE).name == "command_r7b" and formats.detect_reasoning(MOE) is COMMAND_R7B_THOUGHT
    user = [{"role": "user", "content": "hi"}]
    on = chat_template.render(MOE, user, extra=COMMAND_R7B_THOUGHT.controls({}, None, None))
    off = chat_template.render(MOE, user, extra=COMMAND_R7B_THOUGHT.controls({}, None, False))
    assert COMMAND_R7B_THOUGHT.opened(on) and not COMMAND_R7B_THOUGHT.opened(off)
    assert off.endswith("<|START_THINKING|><|END_THINKING|>")
    opened = spec(in_thought=True)
    for reply, content, calls in (
            ("I'm\nthinking<|END_THINKING|><|START_TEXT|>Hello, world!<|END_TEXT|>", "Hello, world!", []),
            ("I'm\nthinking<|END_THINKING|>" + ACTION, "", [("special_function", {"arg1": 1})])):
        msg = whole(opened, reply)
        assert (msg["content"] or "", calls_of(msg)) == (content, calls)
        assert msg["reasoning_content"] == "I'm\nthinking"
        assert_streams_as_whole(opened, reply, MARKUP)


def test_random_replies_only_ever_grow():
    pieces = ["<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>",
              "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", '[', ']', '{', '}', ',',
              '"tool_name": "special_function"', '"parameters": {"arg1": 1}', '"tool_call_id": "0"',
              "hi ", "<|START_", '"', "\\", "\n"]
    assert_random_replies_grow([spec(), spec(in_thought=True), ReplySpec(format=FMT)], pieces,
                               "command_r7b")
