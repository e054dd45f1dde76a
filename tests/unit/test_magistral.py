"""Magistral / Ministral 3 Reasoning: ``[THINK]`` thoughts and Mistral calls, read whole, cut at
every character and streamed (reply shapes of llama.cpp's tests), detected from the real
template, and a history whose turns carry thoughts and calls rendered for a 2nd and 3rd turn."""

from __future__ import annotations

import json

import pytest

from app import formats
from app.formats import chat_template
from app.formats.spec import ReplySpec
from tests.support.reply_checks import check_reply
from tests.support.server import DATA

TEMPLATES = DATA / "templates"
MINISTRAL = (TEMPLATES / "mistralai-Ministral-3-14B-Reasoning-2512.jinja").read_text()
# the Unsloth Magistral Small 2509 template's shape: [THINK] taught in the default system prompt,
# calls as [TOOL_CALLS]name[ARGS]{...}, the assistant's text rendered as it is
SMALL = (
    "{{ bos_token }}[SYSTEM_PROMPT]Think first:[THINK]thoughts[/THINK]answer[/SYSTEM_PROMPT]"
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' %}{{ m.content }}{% for c in m.tool_calls or [] %}"
    "[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments|tojson }}{% endfor %}"
    "{{ eos_token }}{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{% endif %}{% endfor %}"
)
MARKUP = ("[THINK", "[/THINK", "[TOOL_CALLS", "[ARGS", "[CALL_ID")
SPEC = ReplySpec(formats.get("magistral"), think=True, thought=formats.REASONING["magistral"])


@pytest.mark.parametrize("template", [MINISTRAL, SMALL], ids=["ministral3", "magistral-small"])
def test_detected_from_the_template(template):
    assert formats.detect(template).name == "magistral"
    assert formats.detect_reasoning(template).name == "magistral"
    mistral = (TEMPLATES / "Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text()
    assert formats.detect(mistral).name == "mistral" and formats.detect_reasoning(mistral) is None


@pytest.mark.parametrize("reply, content, calls, reasoning", [
    ("[THINK]I'm\nthinking[/THINK]Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", [],
     "I'm\nthinking"),
    ("[THINK]raisonnement[/THINK]Réponse", "Réponse", [], "raisonnement"),
    ('[TOOL_CALLS]special_function[ARGS]{"arg1":1}', "", [("special_function", {"arg1": 1})], None),
    ('[THINK]I\'m\nthinking[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1":1}', "",
     [("special_function", {"arg1": 1})], "I'm\nthinking"),
    ('[TOOL_CALLS]special_function[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}', "",
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})],
     None),
    # a call written inside the thought is part of the thought
    ('[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more[/THINK]'
     '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', "", [("special_function", {"arg1": 1})],
     'Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more'),
    ("Sure.[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]{\"city\": \"Paris\"}", "Sure.",
     [("get_weather", {"city": "Paris"})], None),
])
def test_replies(reply, content, calls, reasoning):
    check_reply(SPEC, reply, content, calls, reasoning, MARKUP)


def test_an_unclosed_thought_is_all_thought():
    check_reply(SPEC, '[THINK]maybe [TOOL_CALLS]f[ARGS]{"a": 1}', "", [],
                'maybe [TOOL_CALLS]f[ARGS]{"a": 1}', MARKUP)


def history() -> list[dict]:
    call = {"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "I should look it up.",
         "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18 C"},
        {"role": "assistant", "content": "It is 18 C.", "reasoning_content": "Easy."},
        {"role": "user", "content": "And tomorrow?"},
    ]


@pytest.mark.parametrize("template", [MINISTRAL, SMALL], ids=["ministral3", "magistral-small"])
def test_history_renders_thoughts_calls_and_results(template):
    fmt = formats.detect(template)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "w",
                                               "parameters": {"type": "object"}}}]
    prompt = chat_template.render(template, fmt.history(history()), bos_token="<s>",
                                  eos_token="</s>", extra={"tools": tools})
    assert ('[THINK]I should look it up.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>'
            in prompt)
    assert "[TOOL_RESULTS]18 C[/TOOL_RESULTS]" in prompt
    assert "[THINK]Easy.[/THINK]It is 18 C.</s>[INST]And tomorrow?[/INST]" in prompt
    assert "None" not in prompt


def test_history_maps_ids_to_mistral_ids():
    out = formats.get("magistral").history(history())
    assert out[1]["tool_calls"][0]["id"] == out[2]["tool_call_id"]
    assert len(out[2]["tool_call_id"]) == 9 and out[2]["tool_call_id"].isalnum()
