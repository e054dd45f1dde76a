"""llama-server's introspection routes as pure functions: /tokenize and /detokenize bodies,
token pieces, /props and /slots answers, and which settings /props may show; and vLLM's forms
of /tokenize, /detokenize and /tokenizer_info beside them (lm-eval's remote tokenizer).

Shapes follow llama.cpp's tools/server README, so tools built on llama-server work unchanged;
a /tokenize body says which form it is by its fields (``content``: llama-server's; ``prompt``
or ``messages``: vLLM's).
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path, PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.base.errors import BadRequest
from app.engine.types import ModelInfo, SamplingParams
from app.protocol import validate

# A detokenize request, and a tokenize answer with pieces, hold at most this many tokens: more
# than any context, few enough that the answer stays in the tens of MB (a piece can be ~100 bytes).
MAX_LISTED_TOKENS = 262_144

# /props never shows a setting whose name has one of these in it, whatever its value: a key or
# token setting added later (an API key) stays out without anyone remembering this list. The
# rule is by name only, so special_tokens_in_messages is not shown either.
SECRET_WORDS = ("key", "token", "secret", "password", "credential")
SECRET_NAME = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
# ... nor these: where the model and the cache live (bucket URIs, local paths); the model file's
# basename is shown as model_path, the template's text as chat_template
LOCATION_SETTINGS = frozenset({"model", "model_cache_dir", "chat_template", "storage_emulator_host",
                               "draft_model", "prompt_cache_dir"})
# ... except these, named here one by one: token counts, not tokens (shown only as integers)
TOKEN_COUNTS = frozenset({"default_max_tokens", "max_tokens_limit", "prompt_cache_min_tokens"})


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    content: str
    add_special: bool = False  # BOS (and the like) as the model adds them
    parse_special: bool = True  # control-token text becomes control tokens
    with_pieces: bool = False
    model: str | None = None  # checked like every request's (STRICT_MODEL_NAME)


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tokens: list[int] = Field(max_length=MAX_LISTED_TOKENS)
    model: str | None = None


class VllmTokenize(BaseModel):
    """vLLM's TokenizeCompletionRequest: a text."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: str
    add_special_tokens: bool = True  # BOS (and the like) as the model adds them
    return_token_strs: bool | None = False
    model: str | None = None


class VllmTokenizeChat(BaseModel):
    """vLLM's TokenizeChatRequest: a conversation, through the chat template as a chat request
    renders it. ``messages``, ``tools`` and ``chat_template_kwargs`` are checked by the chat
    request's own parser."""

    model_config = ConfigDict(extra="forbid", strict=True)
    messages: list[Any] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: Literal[False] = False
    add_special_tokens: bool = False  # a BOS on top of what the template writes
    return_token_strs: bool | None = False
    tools: list[Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    model: str | None = None

    @field_validator("continue_final_message", mode="before")
    @classmethod
    def _no_continue(cls, v: Any) -> Any:
        if v is True:
            raise ValueError("not supported: the last message is ended as the template ends it")
        return v


# vLLM fields this server does not take, with why
_VLLM_UNSUPPORTED = {
    "chat_template": "the server's chat template is used (the CHAT_TEMPLATE setting sets it)",
    "media_io_kwargs": "this server takes text only",
    "mm_processor_kwargs": "this server takes text only",
}
_HINT = "see docs/api.md, Introspection"


def tokenize_form(body: Any) -> Literal["llama.cpp", "vllm", "vllm-chat"]:
    """Which /tokenize a body is: llama-server's (``content``) or vLLM's (``prompt``, or
    ``messages``); a body with none or several of them is a 400."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    named = [k for k in ("content", "prompt", "messages") if body.get(k) is not None]
    if len(named) != 1:
        raise BadRequest(
            "send one of content (llama-server's form), prompt or messages (vLLM's form)"
            + (f", not {' and '.join(named)}" if named else ""),
            param=named[-1] if named else "content",
        )
    return {"content": "llama.cpp", "prompt": "vllm", "messages": "vllm-chat"}[named[0]]  # type: ignore[return-value]


def parse_tokenize(body: Any) -> TokenizeRequest:
    return validate.parse(TokenizeRequest, body, hint=_HINT)


def parse_vllm_tokenize(body: Any) -> VllmTokenize:
    return validate.parse(VllmTokenize, body, _VLLM_UNSUPPORTED, _HINT)


def parse_vllm_tokenize_chat(body: Any) -> VllmTokenizeChat:
    return validate.parse(VllmTokenizeChat, body, _VLLM_UNSUPPORTED, _HINT)


def parse_detokenize(body: Any) -> DetokenizeRequest:
    if isinstance(body, dict) and isinstance(body.get("tokens"), list):
        n = len(body["tokens"])
        if n > MAX_LISTED_TOKENS:  # before pydantic builds an error per element
            raise BadRequest(f"tokens: {n} tokens, at most {MAX_LISTED_TOKENS} in one request",
                             param="tokens")
    return validate.parse(DetokenizeRequest, body, hint=_HINT)


def piece(data: bytes) -> str | list[int]:
    """A token's piece as llama-server writes it: a string when it is valid UTF-8 on its own,
    else its byte values (half of a multi-byte character)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def check_pieces(n_tokens: int, param: str = "with_pieces", what: str = "content") -> None:
    """Whether a tokenize answer of this many tokens may list their pieces."""
    if n_tokens > MAX_LISTED_TOKENS:
        raise BadRequest(
            f"{what} is {n_tokens} tokens: {param} lists at most {MAX_LISTED_TOKENS} "
            "(without it, any length the body allows)", param=param)


def tokenize_answer(tokens: list[int], pieces: list[bytes] | None) -> dict[str, Any]:
    if pieces is None:
        return {"tokens": tokens}
    return {"tokens": [{"id": t, "piece": piece(p)} for t, p in zip(tokens, pieces, strict=True)]}


def vllm_tokenize_answer(tokens: list[int], max_model_len: int,
                         pieces: list[bytes] | None) -> dict[str, Any]:
    """vLLM's TokenizeResponse; ``token_strs`` (with return_token_strs) are the tokens' texts
    (llama.cpp's pieces, half of a character as U+FFFD), null otherwise."""
    strs = None if pieces is None else [p.decode("utf-8", errors="replace") for p in pieces]
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens,
            "token_strs": strs}


def detokenize_answer(pieces: list[bytes]) -> dict[str, Any]:
    """The pieces joined, then decoded (a character split over two tokens comes out whole; an
    incomplete one at the end becomes U+FFFD, as llama-server's does). Both forms send the
    same body (``tokens``), so the answer carries both names: llama-server's ``content`` and
    vLLM's ``prompt``."""
    text = b"".join(pieces).decode("utf-8", errors="replace")
    return {"content": text, "prompt": text}


def tokenizer_info(info: ModelInfo) -> dict[str, Any]:
    """vLLM's GET /tokenizer_info: the tokenizer's configuration, in tokenizer_config.json's
    names (lm-eval's remote tokenizer reads eos_token, bos_token, pad_token, chat_template)."""
    out: dict[str, Any] = {
        "tokenizer_class": "LlamaCppTokenizer",
        "vocab_type": info.vocab_type or None,
        "vocab_size": info.n_vocab,
        "bos_token": info.bos_token or None,
        "eos_token": info.eos_token or None,
        "pad_token": info.pad_token or None,
        "add_bos_token": info.add_bos,
        "model_max_length": info.n_ctx,
        "max_model_len": info.n_ctx,
    }
    if info.chat_template:
        out["chat_template"] = info.chat_template
    return out


def public_settings(settings: BaseModel) -> dict[str, Any]:
    """The effective settings /props may show: none whose name looks like a secret, none that
    says where the model or the cache live, and no value that is a path or a URI."""
    out: dict[str, Any] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if name in TOKEN_COUNTS and type(value) is int:
            out[name] = value
            continue
        if SECRET_NAME.search(name) or name in LOCATION_SETTINGS:
            continue
        if isinstance(value, PurePath) or (isinstance(value, str) and "://" in value):
            continue
        out[name] = value
    return out


def build_info() -> str:
    """This server's version and llama-cpp-python's (when loaded: the fake engine loads none)."""
    try:
        ours = metadata.version("vertex-gguf")
    except metadata.PackageNotFoundError:
        ours = "unknown"
    llama = getattr(sys.modules.get("llama_cpp"), "__version__", None)
    return f"vertex-gguf {ours}" + (f", llama-cpp-python {llama}" if llama else "")


def generation_defaults(n_ctx: int, model: str, max_tokens: int | None = None,
                        sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """llama-server's default_generation_settings: what a request that sets nothing gets
    (SamplingParams' defaults, with ``sampling``: the server's DEFAULT_TEMPERATURE and the
    like; ``max_tokens``: the server's default length, -1 for none, as llama.cpp writes it)."""
    p = {**asdict(SamplingParams()), **(sampling or {})}
    n_predict = -1 if max_tokens is None else max_tokens
    return {
        "n_ctx": n_ctx,
        "model": model,
        "params": {
            "n_predict": n_predict,
            "max_tokens": n_predict,
            "seed": p["seed"],
            "temperature": p["temperature"],
            "top_k": p["top_k"],
            "top_p": p["top_p"],
            "min_p": p["min_p"],
            "repeat_last_n": p["penalty_last_n"],
            "repeat_penalty": p["repeat_penalty"],
            "presence_penalty": p["presence_penalty"],
            "frequency_penalty": p["frequency_penalty"],
            "stop": list(p["stop"]),
            "ignore_eos": p["ignore_eos"],
            "cache_prompt": True,
        },
    }


def props(info: ModelInfo, meta: dict[str, Any], total_slots: int,
          settings: BaseModel, boot: dict[str, Any] | None = None) -> dict[str, Any]:
    """GET /props: llama-server's fields, the model's names and metadata, the settings, what
    llama.cpp was built with and let use, and (``boot``) earlier workers' deaths and safe mode."""
    return {
        "default_generation_settings": generation_defaults(
            info.n_ctx, info.name, meta.get("max_tokens_default"),
            {name: getattr(settings, f"default_{name}", None)
             for name in ("temperature", "top_p", "top_k", "min_p")
             if getattr(settings, f"default_{name}", None) is not None}),
        "total_slots": total_slots,
        "n_ctx": info.n_ctx,
        "n_ctx_train": info.n_ctx_train,
        "context_beyond_training": info.beyond_training,
        "model_alias": info.name,
        "model_path": Path(info.path).name,  # never the directory or the bucket it came from
        "aliases": list(info.names),
        "tags": list(info.tags),
        "meta": meta,
        "chat_template": info.chat_template or "",
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "modalities": info.modalities,
        "build_info": build_info(),
        "system_info": info.system_info,
        "cpu_extra_buffers": info.cpu_extra_buffers,
        "cuda": info.cuda,
        "cxx_runtime": info.cxx_runtime,
        "placement": info.placement,
        "memory": info.memory,
        "settings": public_settings(settings),
        **(boot or {}),
    }
