"""An Ollama request (``/api/chat``, ``/api/generate``): its schema, its ``options``, ``format``,
``think`` and messages in the core's terms.

Ollama's own server ignores an option it does not know (with a line in its log); here an
unknown option is a 400 naming it, as an unknown field is, while the options Ollama defines that
only place or load a model (``num_gpu``, ``num_thread``, ``use_mmap``, ...) are accepted and
change nothing: the server's settings decide those for every request alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.base.errors import BadRequest
from app.core.input import EFFORT_BUDGET, OutputFormat, template_call
from app.engine.types import MEDIA, SamplingParams
from app.formats.chat_template import clean
from app.protocol import validate
from app.protocol.openai import MAX_STOP_CHARS
from app.settings.models import keep_alive_seconds

# Sampling options: Ollama's name -> SamplingParams' field (num_predict is handled apart).
SAMPLING = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "seed": "seed", "repeat_penalty": "repeat_penalty", "repeat_last_n": "penalty_last_n",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
}
# Options Ollama defines that load or place the model: the server's settings decide them.
IGNORED_OPTIONS = frozenset({
    "num_keep", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "vocab_only",
    "use_mmap", "use_mlock", "num_thread", "numa", "logits_all", "embedding_only",
})
# Options Ollama defines whose sampler this server does not have: refused, since ignoring them
# would change what is sampled.
REFUSED_OPTIONS = {
    "typical_p": "typical sampling is not supported",
    "tfs_z": "tail-free sampling is not supported",
    "mirostat": "mirostat sampling is not supported",
    "mirostat_tau": "mirostat sampling is not supported",
    "mirostat_eta": "mirostat sampling is not supported",
    "penalize_newline": "not supported",
}

# Request fields Ollama defines that change nothing here, with why (docs/ollama.md).
IGNORED = {
    "keep_alive": "the model stays loaded by the server's SLEEP_IDLE_SECONDS, for every "
                  "request alike",
}
UNSUPPORTED = {
    "template": "the model's own chat template is used (or the server's CHAT_TEMPLATE)",
    "suffix": "fill-in-the-middle is not supported",
}


def model_of(name: str) -> str:
    """The model a request names, as the core knows it: Ollama's default tag ``:latest``
    dropped (a client that listed ``smol:latest`` in /api/tags sends that)."""
    return name.removesuffix(":latest")


def requested_model(body: Any) -> str | None:
    """The model a chat, generate or embed body names (None: none, or not a string, which the
    parser refuses), as the core knows it."""
    name = body.get("model") if isinstance(body, dict) else None
    return (model_of(name) or None) if isinstance(name, str) else None


def keep_alive(body: Any) -> float | None:
    """The request's ``keep_alive`` in seconds, read as Ollama reads it (its api.Duration): a
    number is seconds, a string a duration (``30s``, ``5m``, ``1h30m``; a whole number of
    seconds too, as KEEP_ALIVE takes it), negative is forever (inf), ``0`` unloads the model
    after the answer. None (absent, or an empty string): the model's own KEEP_ALIVE."""
    value = body.get("keep_alive") if isinstance(body, dict) else None
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None  # the wrong type: left to the parser (chat and generate refuse it)
    bad = BadRequest(f"keep_alive: {str(value)[:50]!r} is neither a duration (30s, 5m, 1h30m; "
                     "negative: forever) nor a number of seconds", param="keep_alive")
    if isinstance(value, str):
        try:
            return keep_alive_seconds(value)
        except ValueError:
            raise bad from None
    if math.isnan(value):
        raise bad
    return math.inf if value < 0 else float(value)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Request(_Strict):
    model: str = Field(min_length=1)
    format: Literal["json"] | dict[str, Any] | Literal[""] | None = None
    options: dict[str, Any] | None = None
    stream: bool = True  # Ollama streams unless asked not to
    think: bool | Literal["low", "medium", "high"] | None = None
    keep_alive: str | int | float | None = None  # accepted: see IGNORED

    def sampling(self) -> tuple[SamplingParams, int | None]:
        """``options`` as sampling parameters, and the context asked for (``num_ctx``); a
        value of the wrong type is a 400 naming it."""
        opts = dict(self.options or {})
        params: dict[str, Any] = {"temperature": None, "top_p": None, "top_k": None,
                                  "min_p": None, "max_tokens_param": "options.num_predict"}
        for key, value in opts.items():
            where = f"options.{key}"
            if value is None or key in IGNORED_OPTIONS:
                continue
            if key in REFUSED_OPTIONS:
                raise BadRequest(f"{where}: {REFUSED_OPTIONS[key]}", param=where)
            if key == "num_predict":
                n = _number(value, where, int)
                if n < -2 or n == 0:
                    raise BadRequest(f"{where}: a count of tokens, or -1 (-2) for no limit but "
                                     "the context", param=where)
                params["max_tokens"] = None if n < 0 else n
            elif key == "stop":
                params["stop"] = _stops(value, where)
            elif key == "num_ctx":
                params["_num_ctx"] = _number(value, where, int)  # checked by the caller
            elif key == "repeat_last_n":
                n = _number(value, where, int)
                if n < -1:
                    raise BadRequest(f"{where}: how many tokens back the penalties look: 0 (off), "
                                     "a count, or -1 (the context)", param=where)
                params["penalty_last_n"] = n  # -1 and past the context: resolved by the caller
            elif key in SAMPLING:
                kind = int if key in ("top_k", "seed") else float
                params[SAMPLING[key]] = _number(value, where, kind)
            else:
                raise BadRequest(f"{where}: Ollama defines no such option", param=where)
        num_ctx = params.pop("_num_ctx", None)
        return SamplingParams(**params), num_ctx

    def output(self) -> OutputFormat | None:
        """``format``: ``"json"`` is any JSON object, a schema holds the reply to it."""
        if not self.format:
            return None
        if self.format == "json":
            return OutputFormat("json_object", param="format")
        return OutputFormat("json_schema", self.format, "format")

    def thinking(self) -> dict[str, Any]:
        """``think`` as ChatInput's fields: ``false`` asks the template to skip the thought,
        ``true`` to think; an effort is that effort, and a budget from the effort table."""
        if isinstance(self.think, str):
            return {"effort": self.think, "reasoning_budget": EFFORT_BUDGET[self.think]}
        return {"thinking": self.think}


class ChatRequest(_Request):
    messages: list[Any] = Field(default_factory=list)
    tools: list[Any] | None = None


class GenerateRequest(_Request):
    prompt: str = ""
    images: list[Any] | None = None  # base64, each put before the prompt
    system: str | None = None
    raw: bool = False
    context: list[int] | None = None


def parse(model: type[BaseModel], body: Any) -> Any:
    return validate.parse(model, body, UNSUPPORTED, "see docs/ollama.md", ignored=IGNORED)


def _number(value: Any, where: str, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{where}: must be a number", param=where)
    if kind is int and value != int(value):
        raise BadRequest(f"{where}: must be a whole number", param=where)
    return kind(value)


def _stops(value: Any, where: str) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest(f"{where}: a string or a list of strings", param=where)
    if len(stops) > 16 or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"{where}: at most 16, each of at most {MAX_STOP_CHARS} characters",
                         param=where)
    return tuple(s for s in stops if s)


def image_marks(images: Any, where: str, take: Callable[[str, str], Any] | None) -> str:
    """Ollama's ``images`` (base64 strings) as MEDIA marks, each image handed to ``take(data,
    param)``; they stand before the turn's text, as Ollama puts them."""
    if not images:
        return ""
    if not isinstance(images, list) or take is None:
        raise BadRequest(f"{where}: must be a list of base64 images", param=where)
    for k, data in enumerate(images):
        if not isinstance(data, str):
            raise BadRequest(f"{where}.{k}: must be a base64 string", param=f"{where}.{k}")
        take(data, f"{where}.{k}")
    return MEDIA * len(images)


def chat_messages(raw: list[Any], take: Callable[[str, str], Any] | None = None
                  ) -> list[dict[str, Any]]:
    """Ollama's messages as chat-template messages. Ollama's tool calls carry no ids and their
    arguments as objects; each gets an id (``call_<turn>_<n>``), and a ``tool`` message is
    matched to the first unanswered call of its ``tool_name`` (else the first unanswered).
    A user message's ``images`` go to ``take`` (image_marks)."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, tool name) not answered yet
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise BadRequest(f"{where}: a message must be an object", param=where)
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"{where}.role: must be system, user, assistant or tool",
                             param=f"{where}.role")
        for key, value in m.items():
            if key not in ("role", "content", "images", "tool_calls", "thinking", "tool_name",
                           "tool_call_id") and value is not None:
                raise BadRequest(f"{where}.{key}: this server does not support this field",
                                 param=f"{where}.{key}")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise BadRequest(f"{where}.content: must be a string", param=f"{where}.content")
        marks = image_marks(m.get("images"), f"{where}.images", take if role == "user" else None)
        msg: dict[str, Any] = {"role": role, "content": marks + clean(content)}
        if role == "assistant":
            if m.get("thinking"):
                msg["reasoning_content"] = str(m["thinking"])
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise BadRequest(f"{where}.tool_calls: must be a list", param=f"{where}.tool_calls")
            if calls:
                msg["tool_calls"] = []
            for n, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest(f"{where}.tool_calls.{n}: needs function.name",
                                     param=f"{where}.tool_calls.{n}")
                cid = f"call_{i}_{n}"
                pending.append((cid, fn["name"]))
                msg["tool_calls"].append(template_call(cid, fn["name"],
                                                       fn.get("arguments", {})))
        elif role == "tool":
            name = m.get("tool_name")
            match = next((p for p in pending if p[1] == name), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
                msg["tool_call_id"] = match[0]
            if name:
                msg["name"] = name
        out.append(msg)
    if not out:
        raise BadRequest("messages: is empty", param="messages")
    return out
