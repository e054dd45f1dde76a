"""One tool request through every API, and what each answer says in its own shape: the calls
(name, arguments) and the thought. For the model families' tests: the same reply must read the
same on Chat Completions, Responses, Anthropic Messages, Gemini, Ollama and a Vertex envelope.

``post(path, body)`` returns the answer's JSON: the Flask test client in process, ``requests``
against a real server."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Post = Callable[[str, dict[str, Any]], Any]
Read = tuple[list[tuple[str, Any]], str | None]  # (calls as (name, arguments)), the thought)
APIS = ("chat", "chat_stream", "responses", "anthropic", "gemini", "ollama", "vertex")


def _chat_read(body: dict[str, Any]) -> Read:
    msg = body["choices"][0]["message"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in msg.get("tool_calls") or []]
    return calls, msg.get("reasoning_content")


def _sse_read(text: str) -> Read:
    """A streamed chat's deltas added up: each call's name once, its arguments joined."""
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    thought: list[str] = []
    for block in text.split("\n\n"):
        if not block.startswith("data: {"):
            continue
        choices = json.loads(block[6:])["choices"]
        delta = choices[0]["delta"] if choices else {}
        thought.append(delta.get("reasoning_content") or "")
        for tc in delta.get("tool_calls") or []:
            if "name" in tc["function"]:
                assert tc["index"] not in names, "a call's name sent twice"
                names[tc["index"]] = tc["function"]["name"]
            args[tc["index"]] = args.get(tc["index"], "") + tc["function"]["arguments"]
    return [(names[i], json.loads(args[i])) for i in sorted(names)], "".join(thought) or None


def requests_for(tool: dict[str, Any], messages: list[dict[str, Any]], forced: bool,
                 max_tokens: int = 200) -> dict[str, tuple[str, dict[str, Any]]]:
    """(path, body) per API for ``messages`` (OpenAI shape, plain user/system turns) with the
    one OpenAI ``tool``, a call forced where the API can force one (Ollama cannot)."""
    fn = tool["function"]
    user = [m for m in messages if m["role"] == "user"]
    chat = {"model": "m", "messages": messages, "tools": [tool], "max_tokens": max_tokens,
            "temperature": 0, **({"tool_choice": "required"} if forced else {})}
    return {
        "chat": ("/v1/chat/completions", chat),
        "chat_stream": ("/v1/chat/completions", {**chat, "stream": True}),
        "responses": ("/v1/responses", {
            "model": "m", "input": [{"role": m["role"], "content": m["content"]} for m in messages],
            "tools": [{"type": "function", "name": fn["name"], "description": fn["description"],
                       "parameters": fn["parameters"]}],
            "max_output_tokens": max_tokens, "temperature": 0,
            **({"tool_choice": "required"} if forced else {})}),
        "anthropic": ("/v1/messages", {
            "model": "m", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": m["content"]} for m in user],
            "tools": [{"name": fn["name"], "description": fn["description"],
                       "input_schema": fn["parameters"]}],
            **({"tool_choice": {"type": "any"}} if forced else {})}),
        "gemini": ("/v1beta/models/m:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": m["content"]}]} for m in user],
            "tools": [{"functionDeclarations": [{"name": fn["name"],
                                                 "description": fn["description"],
                                                 "parameters": fn["parameters"]}]}],
            "generationConfig": {"maxOutputTokens": max_tokens, "temperature": 0,
                                 "thinkingConfig": {"includeThoughts": True}},
            **({"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}} if forced else {})}),
        "ollama": ("/api/chat", {"model": "m", "messages": messages, "tools": [tool],
                                 "stream": False,
                                 "options": {"num_predict": max_tokens, "temperature": 0}}),
        "vertex": ("/predict", {"instances": [{"@requestFormat": "chat", **chat}]}),
    }


def read(api: str, answer: Any) -> Read:
    """The calls and the thought of ``api``'s answer (a stream's text for chat_stream)."""
    if api == "chat":
        return _chat_read(answer)
    if api == "chat_stream":
        return _sse_read(answer)
    if api == "vertex":
        return _chat_read(answer["predictions"][0])
    if api == "responses":
        out = answer["output"]
        calls = [(o["name"], json.loads(o["arguments"])) for o in out if o["type"] == "function_call"]
        thought = "".join(c["text"] for o in out if o["type"] == "reasoning" for c in o["content"])
        return calls, thought or None
    if api == "anthropic":
        blocks = answer["content"]
        calls = [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
        thought = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
        return calls, thought or None
    if api == "gemini":
        parts = answer["candidates"][0]["content"]["parts"]
        calls = [(p["functionCall"]["name"], p["functionCall"].get("args", {}))
                 for p in parts if "functionCall" in p]
        thought = "".join(p["text"] for p in parts if p.get("thought"))
        return calls, thought or None
    if api == "ollama":
        msg = answer["message"]
        calls = [(c["function"]["name"], c["function"]["arguments"])
                 for c in msg.get("tool_calls") or []]
        return calls, msg.get("thinking")
    raise ValueError(api)


def text_of(api: str, answer: Any) -> str:
    """The answer's text (content) in ``api``'s shape (not for chat_stream)."""
    if api in ("chat", "vertex"):
        body = answer if api == "chat" else answer["predictions"][0]
        return body["choices"][0]["message"]["content"] or ""
    if api == "responses":
        return "".join(c.get("text", "") for o in answer["output"] if o["type"] == "message"
                       for c in o["content"])
    if api == "anthropic":
        return "".join(b["text"] for b in answer["content"] if b["type"] == "text")
    if api == "gemini":
        return "".join(p.get("text", "") for p in answer["candidates"][0]["content"]["parts"]
                       if not p.get("thought") and "functionCall" not in p)
    if api == "ollama":
        return answer["message"]["content"]
    raise ValueError(api)


def histories(tool: dict[str, Any], call: tuple[str, dict[str, Any]], limit: int = 50
              ) -> dict[str, tuple[str, dict[str, Any]]]:
    """The same conversation (a user turn, ``call`` to the OpenAI ``tool``, its result "sunny", a
    new user turn) in each API's own shape, answered in at most ``limit`` tokens."""
    args = json.dumps(call[1])
    fn = tool["function"]
    chat = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": call[0], "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "And tomorrow?"}]
    return {
        "chat": ("/v1/chat/completions", {"messages": chat, "tools": [tool], "max_tokens": limit}),
        "responses": ("/v1/responses", {"model": "m", "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": call[0], "arguments": args},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"role": "user", "content": "And tomorrow?"}], "max_output_tokens": limit,
            "tools": [{"type": "function", "name": fn["name"], "description": fn["description"],
                       "parameters": fn["parameters"]}]}),
        "anthropic": ("/v1/messages", {"model": "m", "max_tokens": limit, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": call[0], "input": call[1]}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "And tomorrow?"}]}],
            "tools": [{"name": fn["name"], "description": fn["description"],
                       "input_schema": fn["parameters"]}]}),
        "gemini": ("/v1beta/models/m:generateContent", {"contents": [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            {"role": "model", "parts": [{"functionCall": {"name": call[0], "args": call[1]}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": call[0],
                                                             "response": {"result": "sunny"}}}]},
            {"role": "user", "parts": [{"text": "And tomorrow?"}]}],
            "tools": [{"functionDeclarations": [{"name": fn["name"], "description": fn["description"],
                                                 "parameters": fn["parameters"]}]}],
            "generationConfig": {"maxOutputTokens": limit}}),
        "ollama": ("/api/chat", {"model": "m", "stream": False, "tools": [tool],
                                 "options": {"num_predict": limit}, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": call[0], "arguments": call[1]}}]},
            {"role": "tool", "content": "sunny", "tool_name": call[0]},
            {"role": "user", "content": "And tomorrow?"}]}),
        "vertex": ("/predict", {"instances": [{"@requestFormat": "chat", "messages": chat,
                                               "tools": [tool], "max_tokens": limit}]}),
    }
