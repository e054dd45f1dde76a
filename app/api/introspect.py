"""llama-server's introspection routes, for tools built on it: POST /tokenize, POST
/detokenize, GET /props and GET /slots (shapes: app.protocol.introspect); and vLLM's forms of
/tokenize and /detokenize on the same routes, with its GET /tokenizer_info (lm-eval's remote
tokenizer). Errors are in OpenAI's shape, as llama-server's and vLLM's are.

Tokenizing (and encoding a long answer) runs on a worker thread, never on the hub, where a
10 MB body would stall every stream, nor on the engine thread, which only decodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flask import Flask, Response, current_app, jsonify, request

from app import formats
from app.api.base import read_body
from app.base.errors import NotSupported, Unavailable
from app.core.input import ChatInput
from app.core.service import Service
from app.protocol import introspect, openai
from app.settings import Settings, max_tokens_bounds, slots_endpoint_on


def _service() -> Service:
    """The default model's; with several models, the one ``?model=`` names (never loaded
    here: 503 model_not_ready while it is not)."""
    pool = current_app.extensions.get("vertex_gguf_pool")
    if pool is not None and request.args.get("model"):
        return pool.service_named(request.args["model"])
    return current_app.extensions["vertex_gguf"]


def _model() -> tuple[Service, Settings, dict[str, str] | None]:
    """The Service and Settings of the model the request names: with several models the one
    ``?model=`` names (else the default model), each with the settings of its own preset, and
    what safe mode changed of them; with one, the server's (None: no model of its own)."""
    pool = current_app.extensions.get("vertex_gguf_pool")
    if pool is None:
        return (current_app.extensions["vertex_gguf"],
                current_app.extensions["vertex_gguf_settings"], None)
    spec = pool.spec_named(request.args.get("model") or None)
    return pool.service_named(spec.name), spec.settings, spec.safe_mode


def _boot_report(safe_mode: dict[str, str] | None) -> dict[str, Any]:
    """Earlier workers' deaths and safe mode; a pool's model: what safe mode changed of its
    own settings."""
    boot = current_app.extensions.get("vertex_gguf_boot")
    report = boot.report() if boot is not None else {}
    if safe_mode is not None and "safe_mode" in report:
        report["safe_mode"] = {**report["safe_mode"], "changed": dict(safe_mode)}
    return report


def _off_hub(svc: Service, answer: Callable[[], dict[str, Any]]) -> Response:
    """``answer`` computed and JSON-encoded on a worker thread (within PREPARE_TIMEOUT)."""
    data = svc.offload(
        lambda: json.dumps(answer(), ensure_ascii=False, separators=(",", ":")).encode())
    return Response(data, mimetype="application/json")


def tokenize() -> Response:
    """llama-server's ``{"content", "add_special"?, "parse_special"?, "with_pieces"?}`` ->
    ``{"tokens"}``; vLLM's ``{"prompt", "add_special_tokens"?, "return_token_strs"?}`` or
    ``{"messages", "add_generation_prompt"?, "tools"?, ...}`` -> ``{"count", "max_model_len",
    "tokens", "token_strs"}``. The body's fields say which."""
    body = read_body()
    svc = _service()
    form = introspect.tokenize_form(body)
    if form == "vllm-chat":
        return _tokenize_chat(svc, body)
    if form == "vllm":
        return _off_hub(svc, lambda: _vllm_tokenize(svc, body))

    def answer() -> dict[str, Any]:
        req = introspect.parse_tokenize(body)
        svc.model_name(req.model)
        tokens = svc.engine.tokenize(req.content, req.add_special, req.parse_special)
        if not req.with_pieces:
            return introspect.tokenize_answer(tokens, None)
        introspect.check_pieces(len(tokens))
        return introspect.tokenize_answer(tokens, svc.engine.pieces(tokens))

    return _off_hub(svc, answer)


def _vllm_tokenize(svc: Service, body: Any) -> dict[str, Any]:
    """vLLM's text form: control-token text is parsed (an HF tokenizer's added tokens always
    are), so ``eos_token`` from /tokenizer_info tokenizes to its one id."""
    req = introspect.parse_vllm_tokenize(body)
    svc.model_name(req.model)
    tokens = svc.engine.tokenize(req.prompt, req.add_special_tokens, True)
    return _vllm_answer(svc, tokens, bool(req.return_token_strs), "prompt")


def _vllm_answer(svc: Service, tokens: list[int], strs: bool, what: str) -> dict[str, Any]:
    pieces = None
    if strs:
        introspect.check_pieces(len(tokens), "return_token_strs", what)
        pieces = svc.engine.pieces(tokens)
    return introspect.vllm_tokenize_answer(tokens, svc.info().n_ctx, pieces)


def _tokenize_chat(svc: Service, body: Any) -> Response:
    """vLLM's chat form: the messages (and tools, chat_template_kwargs) parsed by the chat
    route's own parser and planned as a chat request is (the chat template, message text kept
    text), then tokenized as its generation would be."""
    chat = next(a for a in current_app.extensions["vertex_gguf_apis"] if a.name == "chat")

    def parse() -> tuple[ChatInput, introspect.VllmTokenizeChat]:  # off the hub, as a chat's
        req = introspect.parse_vllm_tokenize_chat(body)
        as_chat = {"messages": req.messages, "tools": req.tools,
                   "chat_template_kwargs": req.chat_template_kwargs, "model": req.model}
        facts = replace(chat.facts(), service=svc)  # the default model's: no lease here
        inp, _ = chat.parse({k: v for k, v in as_chat.items() if v is not None}, facts)
        return replace(inp, add_generation_prompt=req.add_generation_prompt), req

    plan, req = svc.prepare(parse)
    gen = replace(plan.generation, add_bos=req.add_special_tokens)

    def answer() -> dict[str, Any]:
        tokens = svc.engine.prompt_tokens(gen)
        return _vllm_answer(svc, tokens, bool(req.return_token_strs), "the conversation")

    return _off_hub(svc, answer)


def tokenizer_info() -> Response:
    """vLLM's GET /tokenizer_info: the tokenizer's configuration (special tokens, the chat
    template, the context length)."""
    return jsonify(introspect.tokenizer_info(_service().info()))


def detokenize() -> Response:
    """``{"tokens": [...]}`` -> ``{"content", "prompt"}`` (llama-server's name and vLLM's: both
    send the same body); an id outside the vocabulary is a 400."""
    body = read_body()
    svc = _service()

    def answer() -> dict[str, Any]:
        req = introspect.parse_detokenize(body)
        svc.model_name(req.model)
        return introspect.detokenize_answer(svc.engine.pieces(req.tokens))

    return _off_hub(svc, answer)


def props() -> Response:
    """llama-server's /props, for the model ``?model=`` names: its own settings (context,
    slots, GPU layers, formats, defaults...), not the server's."""
    svc, settings, safe_mode = _model()
    info = svc.info()
    total = len(svc.engine.slots())
    length = max_tokens_bounds(settings)
    body = introspect.props(info, openai.model_meta(info, length), total, settings,
                            _boot_report(safe_mode))
    # how replies are read: the tool-call format and thought syntax, the control tokens
    body["formats"] = formats.summary(info.chat_template, info.control_texts,
                                      settings.tool_format, settings.reasoning_format)
    # where the engine runs: its process's id (ENGINE_PROCESS=on; null while it restarts), or
    # false in this process
    body["engine_process"] = getattr(svc.engine, "pid", False)
    return jsonify(body)


def slots() -> Response:
    """Each slot's state; a 501 when SLOTS_ENDPOINT is off (llama-server's --no-slots), a 503
    with ``?fail_on_no_slot`` when every slot is busy (as llama-server's)."""
    svc, settings, _ = _model()
    if not slots_endpoint_on(settings):
        raise NotSupported("This server does not support slots endpoint (SLOTS_ENDPOINT is off)")
    svc.info()
    rows = svc.engine.slots()
    if "fail_on_no_slot" in request.args and all(r["is_processing"] for r in rows):
        raise Unavailable("no slot available")
    return jsonify(rows)


def register(app: Flask) -> None:
    app.add_url_rule("/tokenize", "tokenize", tokenize, methods=["POST"])
    app.add_url_rule("/detokenize", "detokenize", detokenize, methods=["POST"])
    app.add_url_rule("/tokenizer_info", "tokenizer_info", tokenizer_info, methods=["GET"])
    app.add_url_rule("/props", "props", props, methods=["GET"])
    app.add_url_rule("/slots", "slots", slots, methods=["GET"])
