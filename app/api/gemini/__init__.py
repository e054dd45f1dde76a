"""The Gemini API (Google Gen AI): ``generateContent``, ``streamGenerateContent``,
``countTokens``, ``embedContent`` and ``batchEmbedContents`` on a model, and the model list, on
the Gemini API's paths (``/v1beta/models/{model}:...``, and ``/v1/models/...``) and on Vertex
AI's publisher-model paths (``/v1/projects/{p}/locations/{l}/publishers/{pub}/models/{m}:...``),
so code written for Gemini, on either service, works here with only its base URL changed.

A request becomes the core's ChatInput (app.api.gemini.parsing); the answer is a
``GenerateContentResponse``, streamed as SSE ``data:`` events with ``alt=sse`` (what the SDK
asks for) or as one JSON array written as it comes (app.api.gemini.stream). API keys may come
in ``x-goog-api-key`` as well (app.edge.auth), never in the query string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.api.base import Api, json_off_hub, read_body
from app.api.embeddings import OFFLOAD_FLOATS, EmbeddingApi
from app.api.gemini import parsing
from app.api.gemini.stream import Chunks, error_body, whole
from app.base.errors import BadRequest, ModelNotFound, ServiceError
from app.core.embed import EmbedInput, Vector
from app.core.events import ChoiceEnd, Failure, Result, Thinking, Tick, Usage
from app.core.input import ChatInput
from app.core.service import Run
from app.engine.types import ModelInfo
from app.protocol.sse import HEADERS

PREFIXES = ("/v1beta/models/<model>", "/v1/models/<model>",
            "/v1/projects/<project>/locations/<location>/publishers/<publisher>/models/<model>",
            "/v1beta1/projects/<project>/locations/<location>/publishers/<publisher>/models/"
            "<model>")
JSON_STREAM = {"Content-Type": "application/json; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
INTERNAL = ("_model", "_stream", "_sse")  # set by the routes from the path and query


def model_of(name: str) -> str:
    return name.removeprefix("models/")


def speaks_gemini(headers: Mapping[str, str]) -> bool:
    """Whether a caller is Google's Gen AI SDK (on ``/v1/models``, which OpenAI's clients share):
    it sends ``x-goog-api-client`` (and its key in ``x-goog-api-key``)."""
    return "x-goog-api-client" in headers or "x-goog-api-key" in headers


def card(info: ModelInfo, name: str) -> dict[str, Any]:
    """A model as the Gemini API describes one."""
    return {"name": f"models/{name}", "baseModelId": name, "version": "001",
            "displayName": name, "description": f"{name}, served by vertex-gguf",
            "inputTokenLimit": info.n_ctx, "outputTokenLimit": info.n_ctx,
            "supportedGenerationMethods": ["generateContent", "streamGenerateContent",
                                           "countTokens", "embedContent",
                                           "batchEmbedContents"]}


def models_list(info: ModelInfo) -> dict[str, Any]:
    return {"models": [card(info, n) for n in info.names]}


@dataclass
class GeminiReq:
    model: str
    thoughts: bool  # includeThoughts
    sse: bool
    n: int
    thought_tokens: int = 0  # completion tokens when the thought's last piece came


class Gemini(Api):
    name = "gemini"
    paths = ()  # the routes carry the model in the path: see blueprint
    request_formats = ("gemini", "generate_content", "generatecontent")
    id_prefix = "gemini"

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "contents" in body

    def wants_stream(self, body: Any) -> bool:
        return isinstance(body, dict) and bool(body.get("_stream"))

    def error_body(self, err: ServiceError) -> dict[str, Any]:
        return error_body(err)

    def new_id(self) -> str:
        return super().new_id().replace("gemini_", "")

    # ---- parsing --------------------------------------------------------------------------
    def parse(self, body: Any) -> tuple[ChatInput, GeminiReq]:
        body = parsing.check_keys(body, "", parsing.REQUEST_FIELDS | frozenset(INTERNAL),
                                  parsing.IGNORED, parsing.UNSUPPORTED)
        model = model_of(str(body.get("_model") or parsing.get(body, "model") or ""))
        params, output, n, thoughts, budget = parsing.generation(
            parsing.get(body, "generationConfig"), self.settings.grammar_max_properties)
        images = self.images()
        messages = parsing.messages(parsing.get(body, "contents"), images)
        system = parsing.system_text(parsing.get(body, "systemInstruction"))
        if system:
            messages.insert(0, {"role": "system", "content": system})
        offered = parsing.parse_tools(parsing.get(body, "tools"), self.settings.max_tools,
                                      self.settings.grammar_max_properties)
        choice, offered = parsing.tool_choice(parsing.get(body, "toolConfig"), offered)
        inp = ChatInput(messages=messages, params=params, tools=offered, tool_choice=choice,
                        output=output, reasoning_budget=budget, n=n,
                        thinking=False if budget == 0 else None,
                        model=model or None, media=tuple(images.items))
        return inp, GeminiReq(model or self.service.info().name, thoughts,
                              bool(body.get("_sse")), n)

    # ---- answers --------------------------------------------------------------------------
    def watch(self, events: Iterator[Any], run: Run, req: GeminiReq) -> Iterator[Any]:
        """The tokens the thought took (the completion tokens when its last piece came)."""
        for ev in events:
            if isinstance(ev, Thinking) and ev.index == 0:
                req.thought_tokens = run.tokens[0]
            yield ev

    def render(self, req: GeminiReq, run: Run, result: Result) -> dict[str, Any]:
        return whole(result.answers, result.usage, req.model, run.id, req.thoughts,
                     req.thought_tokens)

    def render_stream(self, req: GeminiReq, run: Run,
                      headers: Mapping[str, str]) -> Iterator[bytes]:
        return self._chunks(req, run)

    def _chunks(self, req: GeminiReq, run: Run) -> Iterator[bytes]:
        out = Chunks(req.model, run.id, req.thoughts, req.sse)
        last: ChoiceEnd | None = None
        ended = 0
        for ev in self.watch(run.events(heartbeat=self.heartbeat if req.sse else None), run,
                             req):
            if isinstance(ev, Tick):
                yield b": ping\n\n"
            elif isinstance(ev, ChoiceEnd):
                ended += 1
                if ended < run.n:
                    yield from out.finish(ev.index, ev.reason, ev.cut_calls)
                else:
                    last = ev  # the last candidate's end goes out with the usage
            elif isinstance(ev, Usage) and last is not None:
                yield from out.finish(last.index, last.reason, last.cut_calls, ev,
                                      req.thought_tokens)
            elif isinstance(ev, Failure):
                yield from out.error(ev.error)
                return
            else:
                yield from out.feed(ev)

    # ---- routes ---------------------------------------------------------------------------
    def blueprint(self, bp: Blueprint) -> None:
        for prefix in PREFIXES:
            for method, view in (("generateContent", self.generate),
                                 ("streamGenerateContent", self.stream_generate),
                                 ("countTokens", self.count)):
                bp.add_url_rule(f"{prefix}:{method}", f"gemini:{prefix}:{method}", view,
                                methods=["POST"])
        bp.add_url_rule("/v1beta/models", "gemini:models", self.models, methods=["GET"])
        bp.add_url_rule("/v1beta/models/<model>", "gemini:model", self.model_card,
                        methods=["GET"])

    def _body(self, model: str, **internal: Any) -> dict[str, Any]:
        body = read_body()
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        for key in INTERNAL:
            body.pop(key, None)
        return {**body, "_model": model, **internal}

    def generate(self, model: str, **_: str) -> Response:
        return self.respond(self.serve(self._body(model), None, request.headers))

    def stream_generate(self, model: str, **_: str) -> Response:
        sse = request.args.get("alt") == "sse"
        frames = self.serve(self._body(model, _stream=True, _sse=sse), None, request.headers)
        resp = Response(frames, headers=HEADERS if sse else JSON_STREAM,
                        direct_passthrough=True)
        return resp

    def count(self, model: str, **_: str) -> Response:
        body = read_body()
        if isinstance(body, dict) and parsing.get(body, "generateContentRequest") is not None:
            inner = parsing.get(body, "generateContentRequest")
            if not isinstance(inner, dict):
                raise BadRequest("generateContentRequest: must be an object",
                                 param="generateContentRequest")
            body = {k: v for k, v in inner.items() if k != "model"}
        elif isinstance(body, dict):
            body = {k: v for k, v in body.items() if k != "model"}
        total = self.service.count_tokens(lambda: self.parse({**body, "_model": model})[0])
        return jsonify({"totalTokens": total})

    def models(self) -> Response:
        return jsonify(models_list(self.service.info()))

    def model_card(self, model: str) -> Response:
        info = self.service.info()
        name = model_of(model)
        if name not in info.names:
            raise ModelNotFound(f"models/{name} is not found")
        return jsonify(card(info, name))


# ---- embeddings ---------------------------------------------------------------------------------


class GeminiEmbed(EmbeddingApi):
    """``embedContent`` (``{"content": {"parts": [{"text"}]}, "taskType", "title",
    "outputDimensionality"}`` -> ``{"embedding": {"values"}}``) and ``batchEmbedContents``
    (``{"requests": [...]}`` -> ``{"embeddings": [...]}``), over the embedding core; a task
    type's prefix (EMBEDDING_TASK_PREFIXES) as on Vertex's embedding instances."""

    name = "gemini_embed"
    paths = ()
    request_formats = ("gemini_embed",)

    def __init__(self, settings: Any, service: Any):
        super().__init__(settings, service)
        self.prefixes = settings.embedding_task_prefixes

    def error_body(self, err: ServiceError) -> dict[str, Any]:
        return error_body(err)

    def _one(self, req: Any, where: str) -> tuple[str, int | None]:
        req = parsing.check_keys(req, where, frozenset({"model", "content", "taskType", "title",
                                                        "outputDimensionality"}), {}, {})
        content = parsing.get(req, "content")
        parts = parsing._parts(content, f"{where}.content" if where else "content")
        text = "".join(str(parsing.get(p, "text") or "") for p in parts)
        if not text:
            raise BadRequest(f"{where or 'content'}: nothing to embed",
                             param=f"{where}.content" if where else "content")
        title = parsing.get(req, "title")
        task = str(parsing.get(req, "taskType") or "").upper()
        if title:
            text = f"{title}\n\n{text}"
        dims = parsing.get(req, "outputDimensionality")
        return self.prefixes.get(task, "") + text, dims

    def answer(self, body: Any, gone: Callable[[], bool] | None = None) -> dict[str, Any]:
        """An ``embedContent`` body (a Vertex predict instance, or a raw body)."""
        return self.embedded(body, model_of(str(body.get("model") or ""))
                             if isinstance(body, dict) else "", batch=False)

    def embed(self, model: str, batch: bool) -> Response:
        answer = self.embedded(read_body(), model_of(model), batch)
        values = answer["embeddings"] if batch else [answer["embedding"]]
        if sum(len(v["values"]) for v in values) > OFFLOAD_FLOATS:
            return json_off_hub(answer)
        return jsonify(answer)

    def embedded(self, body: Any, model: str, batch: bool) -> dict[str, Any]:
        if batch:
            body = parsing.check_keys(body, "", frozenset({"requests"}), {}, {})
            reqs = parsing.get(body, "requests")
            if not isinstance(reqs, list) or not reqs:
                raise BadRequest("requests: a non-empty list", param="requests")
            items = [self._one(r, f"requests.{i}") for i, r in enumerate(reqs)]
        else:
            items = [self._one({k: v for k, v in body.items() if k != "model"}
                               if isinstance(body, dict) else body, "")]
        dims = {d for _, d in items}
        if len(dims) > 1:
            raise BadRequest("requests: one outputDimensionality for all", param="requests")
        inp = EmbedInput(tuple(t for t, _ in items), model=model or None,
                         dimensions=dims.pop(), truncate=True)
        result = self.embeddings.run(inp, None, self.label)
        err = result.first_error()
        if err is not None:
            raise err
        vectors = [{"values": v.values.tolist()} for v in result.items if isinstance(v, Vector)]
        return {"embeddings": vectors} if batch else {"embedding": vectors[0]}

    def blueprint(self, bp: Blueprint) -> None:
        for prefix in PREFIXES:
            bp.add_url_rule(f"{prefix}:embedContent", f"gemini:{prefix}:embed",
                            lambda model, **kw: self.embed(model, False), methods=["POST"])
            bp.add_url_rule(f"{prefix}:batchEmbedContents", f"gemini:{prefix}:batch",
                            lambda model, **kw: self.embed(model, True), methods=["POST"])
