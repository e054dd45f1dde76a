"""What coding agents send, over the fake engine: Claude Code's Messages fields (context
management, thinking display, output effort, system turns mid-conversation and its ctx/msg roles,
deferred tools, untyped tool schemas, its billing header, an assistant prefill, Anthropic's
overflow wording), Codex's Responses fields (client metadata, namespace and custom tools, hosted
tools left out, its history items), MAX_TOKENS_CLAMP (Qwen Code's 32000-token reservation),
Anthropic's model list, and the warning for a context past the training window. The real agents
run in tests/e2e/test_agents.py."""

from __future__ import annotations

import json
import logging

import pytest

from app.api.anthropic.parsing import MessagesRequest, chat_input, parse
from app.core.plan import fold_system_turns
from app.engine.fake import FakeEngine
from app.engine.types import PROTECT_CLOSE, PROTECT_OPEN
from tests.support.app import make_client

MSG = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.abc; cc_entrypoint=cli; cch=5f3e9;"


def text_of(prompt: str) -> str:
    return prompt.replace(PROTECT_OPEN, "").replace(PROTECT_CLOSE, "")


# ---- Claude Code on Messages ------------------------------------------------------------------


CLAUDE_CODE = {
    "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": False,
    "system": [{"type": "text", "text": BILLING},
               {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"}]},
        {"role": "ctx", "content": "The repository is empty."},
        {"role": "system", "content": "Mind the tests."},
        {"role": "msg", "content": "Say hi."},
    ],
    "tools": [{"name": "Bash", "description": "Run a command", "defer_loading": True,
               "input_schema": {"type": "object", "properties": {
                   "command": {"type": "string"}, "extra": {"description": "anything"}}}},
              {"name": "Anything", "input_schema": {"properties": {"v": {}}}}],
    "thinking": {"type": "adaptive", "display": "omitted"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "metadata": {"user_id": "u"},
}


def test_claude_codes_request_is_served():
    engine = FakeEngine(reply="Hi.")
    resp = make_client(engine).post("/v1/messages", json=CLAUDE_CODE)
    assert resp.status_code == 200, resp.get_json()
    prompt = text_of(engine.requests[-1].prompt)
    assert "x-anthropic-billing-header" not in prompt and "cch=" not in prompt
    assert prompt.index("You are Claude Code.") < prompt.index("The repository is empty.")
    assert prompt.index("The repository is empty.") < prompt.index("Mind the tests.")
    assert prompt.index("Mind the tests.") < prompt.index("Say hi.")
    assert "Bash" in prompt and "Anything" in prompt  # deferred and untyped tools are offered
    # the prompt no longer changes with the nonce: the prefix cache holds across turns
    again = json.loads(json.dumps(CLAUDE_CODE).replace("cch=5f3e9", "cch=77aa0"))
    make_client(engine).post("/v1/messages", json=again)
    assert engine.requests[-1].prompt == engine.requests[-2].prompt


def test_effort_and_budget():
    req = parse(MessagesRequest, CLAUDE_CODE)
    assert chat_input(req, 128, 1 << 20).reasoning_budget == 4096  # high
    both = {**CLAUDE_CODE, "thinking": {"type": "enabled", "budget_tokens": 99}}
    assert chat_input(parse(MessagesRequest, both), 128, 1 << 20).reasoning_budget == 99


def test_omitted_thinking_keeps_the_block_and_drops_its_text():
    engine = FakeEngine(reply="<think>Secret plan.</think>Done.")
    client = make_client(engine, reasoning_format="parsed")
    body = {**MSG, "thinking": {"type": "adaptive", "display": "omitted"}}
    got = client.post("/v1/messages", json=body).get_json()
    assert got["content"] == [{"type": "thinking", "thinking": "", "signature": ""},
                              {"type": "text", "text": "Done."}]
    stream = client.post("/v1/messages", json={**body, "stream": True}).get_data(as_text=True)
    assert "Secret" not in stream and '"type":"thinking"' in stream.replace(" ", "")
    shown = client.post("/v1/messages", json={**body, "thinking": {
        "type": "adaptive", "display": "summarized"}}).get_json()
    assert shown["content"][0]["thinking"] == "Secret plan."


def test_a_final_assistant_message_is_continued():
    engine = FakeEngine(reply="42.")
    body = {**MSG, "messages": [{"role": "user", "content": "What is 6 x 7?"},
                                {"role": "assistant", "content": "The answer is "}]}
    got = make_client(engine).post("/v1/messages", json=body).get_json()
    assert got["content"] == [{"type": "text", "text": "42."}]  # the continuation only
    assert text_of(engine.requests[-1].prompt).endswith("<|im_start|>assistant\nThe answer is ")


STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {**MSG, "messages": [{"role": "user", "content": "a"},
                                          {"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "b"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"},
                                           {"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "b"}]}),
])
def test_a_strict_template_gets_the_system_turn_folded(path, body):
    engine = FakeEngine(chat_template=STRICT_TEMPLATE)
    resp = make_client(engine).post(path, json=body)
    assert resp.status_code == 200, resp.get_json()
    prompt = text_of(engine.requests[-1].prompt)
    assert "<|system|>" not in prompt and "<|user|>be brief\n\nb" in prompt


def test_fold_system_turns():
    keep = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert fold_system_turns(keep) is keep
    late = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
            {"role": "system", "content": "s"}]
    assert fold_system_turns(late) == [{"role": "user", "content": "u\n\ns"},
                                       {"role": "assistant", "content": "a"}]


def test_overflow_is_worded_as_anthropic_words_it():
    engine = FakeEngine(n_ctx=16)
    long = " ".join(["word"] * 40)
    body = {**MSG, "messages": [{"role": "user", "content": long}]}
    err = make_client(engine).post("/v1/messages", json=body)
    assert err.status_code == 400
    msg = err.get_json()["error"]["message"]
    assert msg.startswith("prompt is too long: ") and msg.endswith(" tokens > 16 maximum")
    openai_side = make_client(engine).post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": long}]}).get_json()["error"]
    assert openai_side["code"] == "context_length_exceeded"


def test_anthropics_model_list():
    client = make_client(FakeEngine(aliases=("smol", "claude-sonnet-4-5")))
    head = {"anthropic-version": "2023-06-01"}
    got = client.get("/v1/models", headers=head).get_json()
    assert [m["id"] for m in got["data"]] == ["smol", "claude-sonnet-4-5"]
    assert got["data"][0]["type"] == "model" and got["data"][0]["display_name"] == "smol"
    assert got["data"][0]["created_at"].endswith("Z")
    assert (got["has_more"], got["first_id"], got["last_id"]) == (False, "smol",
                                                                  "claude-sonnet-4-5")
    card = client.get("/v1/models/claude-sonnet-4-5", headers=head).get_json()
    assert card["id"] == "claude-sonnet-4-5" and card["type"] == "model"
    missing = client.get("/v1/models/opus", headers=head)
    assert missing.status_code == 404
    assert missing.get_json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/models").get_json()["object"] == "list"  # OpenAI's without it


# ---- Codex on Responses -----------------------------------------------------------------------

NAMESPACE = {"type": "namespace", "name": "mcp__notes", "description": "Notes server",
             "tools": [{"type": "function", "name": "add_note", "strict": False,
                        "parameters": {"type": "object",
                                       "properties": {"text": {"type": "string"}}}}]}
CUSTOM = {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
          "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
CODEX = {"model": "m", "instructions": "You are Codex.", "input": [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Note it."}]}],
    "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
              NAMESPACE, CUSTOM, {"type": "web_search", "external_web_access": False}],
    "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "stream": False,
    "reasoning": {"effort": "medium", "summary": "auto"}, "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-1", "text": {"verbosity": "low"},
    "client_metadata": {"session_id": "s", "turn_id": "t"}}


def call_reply(name: str, arguments: dict) -> str:
    return json.dumps({"tool_calls": [{"name": name, "arguments": arguments}]})


def test_codexs_request_is_served_and_hosted_tools_left_out(caplog):
    engine = FakeEngine(reply="Done.")
    with caplog.at_level(logging.WARNING):
        resp = make_client(engine).post("/v1/responses", json=CODEX)
    assert resp.status_code == 200, resp.get_json()
    prompt = text_of(engine.requests[-1].prompt)
    assert "mcp__notes__add_note" in prompt and "apply_patch" in prompt and "shell" in prompt
    assert "web_search" not in prompt and "'web_search' tool runs on OpenAI's side" in caplog.text
    assert resp.get_json()["tools"][1] == NAMESPACE  # echoed as sent


def test_a_namespaced_call_goes_back_with_its_namespace():
    engine = FakeEngine(reply=call_reply("mcp__notes__add_note", {"text": "milk"}))
    client = make_client(engine)
    got = client.post("/v1/responses", json=CODEX).get_json()
    call = next(i for i in got["output"] if i["type"] == "function_call")
    assert (call["name"], call["namespace"]) == ("add_note", "mcp__notes")
    assert json.loads(call["arguments"]) == {"text": "milk"}
    events = [json.loads(line[6:]) for line in client.post(
        "/v1/responses", json={**CODEX, "stream": True}).get_data(as_text=True).splitlines()
        if line.startswith("data: ")]
    added = next(e for e in events if e["type"] == "response.output_item.added"
                 and e["item"]["type"] == "function_call")
    assert (added["item"]["name"], added["item"]["namespace"]) == ("add_note", "mcp__notes")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["name"] == "add_note"


def test_a_custom_tool_call_carries_its_input():
    patch = "*** Begin Patch\n*** End Patch"
    engine = FakeEngine(reply=call_reply("apply_patch", {"input": patch}))
    client = make_client(engine)
    got = client.post("/v1/responses", json=CODEX).get_json()
    call = next(i for i in got["output"] if i["type"] == "custom_tool_call")
    assert (call["name"], call["input"]) == ("apply_patch", patch)
    events = [json.loads(line[6:]) for line in client.post(
        "/v1/responses", json={**CODEX, "stream": True}).get_data(as_text=True).splitlines()
        if line.startswith("data: ")]
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == patch
    assert not any(e["type"] == "response.function_call_arguments.delta" for e in events)
    final = events[-1]["response"]["output"]
    assert any(i["type"] == "custom_tool_call" and i["input"] == patch for i in final)


def test_codexs_history_items_reach_the_prompt():
    engine = FakeEngine(reply="Ok.")
    history = [*CODEX["input"],
               {"type": "function_call", "name": "add_note", "namespace": "mcp__notes",
                "arguments": '{"text": "milk"}', "call_id": "call_1"},
               {"type": "function_call_output", "call_id": "call_1", "output": "saved"},
               {"type": "custom_tool_call", "name": "apply_patch", "input": "PATCH",
                "call_id": "call_2"},
               {"type": "custom_tool_call_output", "call_id": "call_2", "output": "applied"}]
    resp = make_client(engine).post("/v1/responses", json={**CODEX, "input": history})
    assert resp.status_code == 200, resp.get_json()
    prompt = text_of(engine.requests[-1].prompt)
    assert "mcp__notes__add_note" in prompt and "PATCH" in prompt and "applied" in prompt


# ---- Qwen Code's reservation: MAX_TOKENS_CLAMP -------------------------------------------------


def test_max_tokens_clamp():
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32000}
    refused = make_client(FakeEngine()).post("/v1/chat/completions", json=body)
    assert refused.status_code == 200  # the fake engine does not check the context
    engine = FakeEngine()
    client = make_client(engine, max_tokens_clamp=True, max_tokens_limit=100)
    got = client.post("/v1/chat/completions", json=body)
    assert got.status_code == 200
    req = engine.requests[-1].params
    assert (req.max_tokens, req.max_tokens_default) == (None, 100)
    strict = make_client(FakeEngine(), max_tokens_limit=100).post("/v1/chat/completions",
                                                                  json=body)
    assert strict.status_code == 400 and strict.get_json()["error"]["param"] == "max_tokens"
    small = make_client(engine, max_tokens_clamp=True).post("/v1/chat/completions",
                                                            json={**body, "max_tokens": 5})
    assert small.status_code == 200 and engine.requests[-1].params.max_tokens_default == 5


# ---- a context past the training window --------------------------------------------------------


def test_a_context_past_the_training_window_is_flagged():
    client = make_client(FakeEngine(n_ctx=512, n_ctx_train=256))
    health = client.get("/health").get_json()
    assert "longer than the model was trained for (256)" in health["warnings"][0]
    props = client.get("/props").get_json()
    assert props["context_beyond_training"] is True and props["n_ctx_train"] == 256
    fine = make_client(FakeEngine())
    assert "warnings" not in fine.get("/health").get_json()
    assert fine.get("/props").get_json()["context_beyond_training"] is False


# ---- the server's sampling defaults (agents send none) -----------------------------------------


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", MSG),
])
def test_sampling_defaults_fill_what_a_request_leaves_unset(path, body):
    engine = FakeEngine()
    client = make_client(engine, default_temperature=0.2, default_top_p=0.9, default_top_k=20,
                         default_min_p=0.05)
    assert client.post(path, json=body).status_code == 200
    p = engine.requests[-1].params
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (0.2, 0.9, 20, 0.05)
    assert client.post(path, json={**body, "temperature": 0.7, "top_p": 0.5}).status_code == 200
    p = engine.requests[-1].params
    assert (p.temperature, p.top_p) == (0.7, 0.5)


def test_sampling_defaults_show():
    client = make_client(FakeEngine(), default_temperature=0.0, default_top_k=40)
    params = client.get("/props").get_json()["default_generation_settings"]["params"]
    assert (params["temperature"], params["top_k"], params["top_p"]) == (0.0, 40, 1.0)
    echoed = client.post("/v1/responses", json={"input": "hi"}).get_json()
    assert echoed["temperature"] == 0.0
    plain = make_client(FakeEngine())
    engine_params = plain.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}]})
    assert engine_params.status_code == 200
