"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed`` and ``/api/embeddings``, with
``/api/tags``, ``/api/show``, ``/api/ps`` and ``/api/version``), for the clients written against
Ollama: its own Python and JavaScript libraries, LangChain's ChatOllama, LiteLLM's
``ollama_chat``, Open WebUI, Continue, and Google's Cloud Run images for open models.

A chat or generate request becomes the core's ChatInput (``raw`` generate: a TextInput); the
answer streams as NDJSON by default, as Ollama's does (app.api.ollama.stream). Errors are
Ollama's ``{"error": "..."}`` with the status. Model management (``pull``, ``push``,
``create``, ``copy``, ``delete``, blobs) answers a clear error: this server serves the one model
it was started with.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from flask import Blueprint

from app.api.base import Answer, Facts
from app.api.embeddings import EmbeddingApi
from app.api.generation import GenerationApi
from app.api.ollama import models
from app.api.ollama.parsing import (
    ChatRequest,
    GenerateRequest,
    _Request,
    chat_messages,
    image_marks,
    keep_alive,
    model_of,
    parse,
    requested_model,
)
from app.api.ollama.stream import NDJSON, Clock, Lines, error_body, timestamp, whole
from app.base.errors import BadRequest, ServiceError
from app.core.embed import EmbedInput, EmbedResult, Vector
from app.core.events import Result, Usage
from app.core.input import ChatInput, TextInput
from app.core.service import Run
from app.engine.types import SamplingParams
from app.formats.chat_template import clean
from app.protocol import tools


@dataclass(frozen=True)
class OllamaReq:
    model: str  # the name the request gave: Ollama echoes it
    chat: bool
    clock: Clock


class _Ollama(GenerationApi):
    """What chat and generate share: streaming by default, NDJSON, Ollama's error shape."""

    chat: ClassVar[bool]
    keepalive = b""  # NDJSON has no comments: a quiet stream sends nothing
    stream_headers = NDJSON
    lenient_content_type = True  # Ollama's clients (LiteLLM, curl -d) send no JSON type

    def requested_model(self, body: Any, facts: Facts) -> str | None:
        return requested_model(body)

    def keep_alive(self, body: Any) -> float | None:
        return keep_alive(body)

    def empty(self, body: dict[str, Any]) -> bool:
        """Whether the request asks for no generation: Ollama loads (or unloads) the model."""
        raise NotImplementedError

    def serve(self, body: Any, facts: Facts) -> Answer:
        """Several models: an empty request loads its model, or with ``keep_alive`` 0 unloads
        it, as Ollama's does. One model is always loaded: the parser says so."""
        if self.models.pooled and isinstance(body, dict) and self.empty(body):
            return self.load_or_unload(body)
        return super().serve(body, facts)

    def load_or_unload(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise BadRequest("model: field required", param="model")
        keep = keep_alive(body)
        if keep == 0:
            self.models.unload(requested_model(body))
            reason = "unload"
        else:
            self.models.load(requested_model(body), keep)
            reason = "load"
        out: dict[str, Any] = {"model": name, "created_at": timestamp()}
        if self.chat:
            out["message"] = {"role": "assistant", "content": ""}
        else:
            out["response"] = ""
        return {**out, "done": True, "done_reason": reason}

    def wants_stream(self, body: Any, facts: Facts) -> bool:
        if not isinstance(body, dict):
            return False
        value = body.get("stream", True)
        if not isinstance(value, bool):
            raise BadRequest("stream: must be true or false", param="stream")
        return value

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return error_body(err)

    def _sampling(self, req: _Request, facts: Facts) -> SamplingParams:
        """``options`` as sampling; ``num_ctx`` may ask for the context a slot has, or less
        (a larger one is a 400: it would not be given). ``repeat_last_n`` of -1 is the context
        (``num_ctx``, else a slot's), and a longer window is cut to it: a reply never looks
        further back, and llama.cpp allocates the whole window per choice up front."""
        params, num_ctx = req.sampling()
        info = self.service_of(facts).info()
        if num_ctx is not None and not 0 < num_ctx <= info.n_ctx:
            raise BadRequest(f"options.num_ctx: this server's context is {info.n_ctx} tokens "
                             "per request (CTX_SIZE); ask for that or less",
                             param="options.num_ctx")
        context = num_ctx or info.n_ctx
        window = params.penalty_last_n
        if window == -1 or window > context:
            params = replace(params, penalty_last_n=context)
        return params

    def render(self, req: OllamaReq, run: Run, result: Result) -> dict[str, Any]:
        return whole(req.model, req.clock, run.first_token_ns, req.chat, result.answers[0],
                     result.usage)

    def renderer(self, req: OllamaReq, run: Run, facts: Facts) -> Lines:
        return Lines(req.model, req.clock, req.chat, run)


class OllamaChat(_Ollama):
    name = "ollama_chat"
    paths = ("/api/chat",)
    request_formats = ("ollama_chat", "ollama", "/api/chat")
    id_prefix = "ollama"
    chat = True

    def looks_like(self, body: dict[str, Any]) -> bool:
        """A raw body is Ollama's chat when its sampling comes in ``options`` (or it names a
        ``format``, ``think`` or ``keep_alive``) beside ``messages``."""
        return "messages" in body and any(k in body for k in ("options", "keep_alive", "think",
                                                                "format"))

    def empty(self, body: dict[str, Any]) -> bool:
        return not body.get("messages")

    def parse(self, body: Any, facts: Facts) -> tuple[ChatInput, OllamaReq]:
        req: ChatRequest = parse(ChatRequest, body)
        params = self._sampling(req, facts)
        images = self.images(facts)
        inp = ChatInput(
            messages=chat_messages(req.messages, images.take),
            media=tuple(images.items),
            params=params,
            tools=tools.validate_tools(req.tools or [], self.settings_of(facts).max_tools),
            output=req.output(),
            model=model_of(req.model),
            **req.thinking(),
        )
        return inp, OllamaReq(req.model, True, Clock())

    def blueprint(self, bp: Blueprint) -> None:
        models.register(bp, self)


class OllamaGenerate(_Ollama):
    name = "ollama_generate"
    paths = ("/api/generate",)
    request_formats = ("ollama_generate", "/api/generate")
    id_prefix = "ollama"
    chat = False

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "prompt" in body and any(k in body for k in ("options", "keep_alive", "raw",
                                                              "system", "think", "context"))

    def empty(self, body: dict[str, Any]) -> bool:
        return not body.get("prompt") and not body.get("images")

    def parse(self, body: Any, facts: Facts) -> tuple[ChatInput | TextInput, OllamaReq]:
        req: GenerateRequest = parse(GenerateRequest, body)
        if req.context:
            raise BadRequest("context: the tokens of an earlier generation are not taken "
                             "back; send the conversation to /api/chat", param="context")
        if not req.prompt:
            raise BadRequest("prompt: is empty (this server's model is always loaded: there "
                             "is nothing to load)", param="prompt")
        params = self._sampling(req, facts)
        reply = OllamaReq(req.model, False, Clock())
        if req.raw:  # the prompt as written, no template
            if req.images:
                raise BadRequest("images: a raw prompt has no template to place them in",
                                 param="images")
            if req.system:
                raise BadRequest("system: a raw prompt has no template to put it in",
                                 param="system")
            if req.format or req.think:
                raise BadRequest("raw: a raw prompt takes no format or think",
                                 param="raw")
            return TextInput(req.prompt, params, model=model_of(req.model)), reply
        messages = ([{"role": "system", "content": req.system}] if req.system else [])
        images = self.images(facts)
        marks = image_marks(req.images, "images", images.take)
        turn = {"role": "user", "content": marks + clean(req.prompt)}
        inp = ChatInput(messages=[*messages, turn], params=params, output=req.output(),
                        model=model_of(req.model), media=tuple(images.items),
                        **req.thinking())
        return inp, reply


# ---- embeddings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _EmbedReq:
    model: str
    legacy: bool  # /api/embeddings: {"prompt"} -> {"embedding"}
    clock: Clock


class OllamaEmbed(EmbeddingApi):
    """``/api/embed`` (``input``: a string or several) and the older ``/api/embeddings``
    (``prompt``: one string), over the same core as the other embedding routes."""

    name = "ollama_embed"
    paths = ("/api/embed", "/api/embeddings")
    lenient_content_type = True
    request_formats = ("ollama_embed", "/api/embed")

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return error_body(err)

    def requested_model(self, body: Any, facts: Facts) -> str | None:
        return requested_model(body)

    def keep_alive(self, body: Any) -> float | None:
        return keep_alive(body)

    def parse(self, body: Any, facts: Facts) -> tuple[EmbedInput, _EmbedReq]:
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        keys = {"model", "input", "prompt", "truncate", "options", "keep_alive", "dimensions"}
        for key, value in body.items():
            if key not in keys and value is not None:
                raise BadRequest(f"{key}: this server does not support this field", param=key)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model: field required", param="model")
        legacy = "prompt" in body and "input" not in body
        raw = body.get("prompt") if legacy else body.get("input")
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not items or not all(
                isinstance(x, str) and x for x in items):
            field = "prompt" if legacy else "input"
            raise BadRequest(f"{field}: a non-empty string (or, for input, a list of them)",
                             param=field)
        truncate = body.get("truncate", True)
        dims = body.get("dimensions")
        if not isinstance(truncate, bool):
            raise BadRequest("truncate: must be true or false", param="truncate")
        if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int)):
            raise BadRequest("dimensions: must be a whole number", param="dimensions")
        inp = EmbedInput(tuple(items), model=model_of(model), dimensions=dims, truncate=truncate)
        return inp, _EmbedReq(model, legacy, Clock())

    def render(self, req: _EmbedReq, result: EmbedResult) -> dict[str, Any]:
        vectors = [v.values.tolist() for v in result.items if isinstance(v, Vector)]
        if req.legacy:
            return {"embedding": vectors[0]}
        took = req.clock.counters(Usage(result.tokens, 0), "stop")
        return {"model": req.model, "embeddings": vectors,
                "total_duration": took["total_duration"], "load_duration": 0,
                "prompt_eval_count": result.tokens}

    def floats(self, answer: dict[str, Any]) -> int:
        vectors = [answer["embedding"]] if "embedding" in answer else answer["embeddings"]
        return sum(len(v) for v in vectors)
