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

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from flask import Blueprint, Response, jsonify, request

from app.api.base import Facts, listed_item, read_body, shown_name
from app.api.embeddings import EmbeddingApi
from app.api.gemini import parsing
from app.api.gemini.stream import Chunks, error_body, whole
from app.api.generation import GenerationApi
from app.base.errors import BadRequest, ModelNotFound, ServiceError
from app.core.embed import EmbedInput, EmbedResult, Vector
from app.core.events import Result
from app.core.input import ChatInput
from app.core.models import Listed
from app.core.service import Run
from app.engine.types import ModelInfo
from app.protocol.sse import HEADERS

PREFIXES = ("/v1beta/models/<model>", "/v1/models/<model>",
            "/v1/projects/<project>/locations/<location>/publishers/<publisher>/models/<model>",
            "/v1beta1/projects/<project>/locations/<location>/publishers/<publisher>/models/"
            "<model>")
JSON_STREAM = {"Content-Type": "application/json; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


def model_of(name: str) -> str:
    return name.removeprefix("models/")


def named_model(body: Any, params: Mapping[str, Any]) -> str:
    """The model a request names, as the core knows it (``models/`` dropped): its path's
    (Facts.params ``model``), else (a predict instance, which has no path) the body's; "" for
    none. The one reading of it: the lease and the parser both ask here."""
    raw = params.get("model") or (parsing.get(body, "model") if isinstance(body, dict) else None)
    return model_of(str(raw or ""))


def card(info: ModelInfo | None, name: str) -> dict[str, Any]:
    """A model as the Gemini API describes one; without its ModelInfo (a pool's model that is
    not loaded) its token limits are not known, and not said."""
    out: dict[str, Any] = {"name": f"models/{name}", "baseModelId": name, "version": "001",
                           "displayName": name, "description": f"{name}, served by vertex-gguf"}
    if info is not None:
        out["inputTokenLimit"] = out["outputTokenLimit"] = info.n_ctx
    out["supportedGenerationMethods"] = ["generateContent", "streamGenerateContent",
                                         "countTokens", "embedContent", "batchEmbedContents"]
    return out


def models_list(info: ModelInfo) -> dict[str, Any]:
    return {"models": [card(info, n) for n in info.names]}


def listed_models(items: list[Listed]) -> dict[str, Any]:
    """Every model of a pool, loaded or not, one entry per name it answers to."""
    return {"models": [card(item.info, name) for item in items
                       for name in (item.name, *item.aliases)]}


def _object(body: Any) -> dict[str, Any]:
    """A generate route's body, which must be an object before anything else is asked of it
    (a 400 even while the model loads)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


@dataclass(frozen=True)
class GeminiReq:
    model: str
    thoughts: bool  # includeThoughts


class Gemini(GenerationApi):
    """``generateContent`` and ``streamGenerateContent`` (the route says which, and the model
    is in its path: Facts.params ``model``, ``stream``, ``sse``), ``countTokens``, the model
    list (which Google's Gen AI SDK also asks for on ``/v1/models``, beside OpenAI's
    clients)."""

    name = "gemini"
    paths = ()  # the routes carry the model in the path: see blueprint
    request_formats = ("gemini", "generate_content", "generatecontent")
    id_prefix = "gemini"

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return error_body(err)

    @classmethod
    def speaks(cls, headers: Mapping[str, str]) -> bool:
        """Google's Gen AI SDK sends ``x-goog-api-client`` (and its key in
        ``x-goog-api-key``)."""
        return "x-goog-api-client" in headers or "x-goog-api-key" in headers

    @classmethod
    def model_name(cls, model_id: str) -> str:
        return model_of(model_id)

    @classmethod
    def model_list(cls, info: ModelInfo) -> dict[str, Any]:
        return models_list(info)

    @classmethod
    def model_card(cls, info: ModelInfo, name: str) -> dict[str, Any]:
        return card(info, name)

    @classmethod
    def listed_list(cls, items: list[Listed]) -> dict[str, Any]:
        return listed_models(items)

    @classmethod
    def listed_card(cls, item: Listed, name: str) -> dict[str, Any]:
        return card(item.info, name)

    def looks_like(self, body: dict[str, Any]) -> bool:
        return "contents" in body

    def wants_stream(self, body: Any, facts: Facts) -> bool:
        return bool(facts.params.get("stream"))

    def requested_model(self, body: Any, facts: Facts) -> str | None:
        return named_model(body, facts.params) or None

    def new_id(self) -> str:
        return super().new_id().replace("gemini_", "")

    # ---- parsing --------------------------------------------------------------------------
    def parse(self, body: Any, facts: Facts) -> tuple[ChatInput, GeminiReq]:
        body = parsing.check_keys(body, "", parsing.REQUEST_FIELDS, parsing.IGNORED,
                                  parsing.UNSUPPORTED)
        model = named_model(body, facts.params)
        settings = self.settings_of(facts)
        params, output, n, thoughts, budget = parsing.generation(
            parsing.get(body, "generationConfig"), settings.grammar_max_properties)
        images = self.images(facts)
        messages = parsing.messages(parsing.get(body, "contents"), images)
        system = parsing.system_text(parsing.get(body, "systemInstruction"))
        if system:
            messages.insert(0, {"role": "system", "content": system})
        offered = parsing.parse_tools(parsing.get(body, "tools"), settings.max_tools,
                                      settings.grammar_max_properties)
        choice, offered = parsing.tool_choice(parsing.get(body, "toolConfig"), offered)
        inp = ChatInput(messages=messages, params=params, tools=offered, tool_choice=choice,
                        output=output, reasoning_budget=budget, n=n,
                        thinking=False if budget == 0 else None,
                        model=model or None, media=tuple(images.items))
        return inp, GeminiReq(model or self.service_of(facts).info().name, thoughts)

    # ---- answers --------------------------------------------------------------------------
    def render(self, req: GeminiReq, run: Run, result: Result) -> dict[str, Any]:
        return whole(result.answers, result.usage, req.model, run.id, req.thoughts)

    def renderer(self, req: GeminiReq, run: Run, facts: Facts) -> Chunks:
        return Chunks(req.model, run.id, req.thoughts, bool(facts.params.get("sse")))

    # ---- routes ---------------------------------------------------------------------------
    def blueprint(self, bp: Blueprint) -> None:
        for prefix in PREFIXES:
            for method, view in (("generateContent", self.generate),
                                 ("streamGenerateContent", self.stream_generate),
                                 ("countTokens", self.count)):
                bp.add_url_rule(f"{prefix}:{method}", f"gemini:{prefix}:{method}", view,
                                methods=["POST"])
        bp.add_url_rule("/v1beta/models", "gemini:models", self.models_view, methods=["GET"])
        bp.add_url_rule("/v1beta/models/<model>", "gemini:model", self.model_view,
                        methods=["GET"])

    def generate(self, model: str, **_: str) -> Response:
        body = _object(read_body())
        return self.respond(self.serve(body, self.facts(request.headers, model=model)))

    def stream_generate(self, model: str, **_: str) -> Response:
        body = _object(read_body())
        sse = request.args.get("alt") == "sse"
        facts = self.facts(request.headers, model=model, stream=True, sse=sse)
        if not sse:  # a JSON array has no room for a keep-alive
            facts = replace(facts, heartbeat=None)
        return Response(self.serve(body, facts), headers=HEADERS if sse else JSON_STREAM,
                        direct_passthrough=True)

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
        lease, facts = self.lease(body, self.facts(request.headers, model=model))
        with lease:
            count = lease.service.count_tokens(lambda: self.parse(body, facts))
        return jsonify({"totalTokens": count})

    def models_view(self) -> Response:
        if self.models.pooled:  # several models: every one, loaded or not
            return jsonify(self.listed_list(self.models.listing()))
        return jsonify(self.model_list(self.models.default_service.info()))

    def model_view(self, model: str) -> Response:
        name = self.model_name(model)
        if self.models.pooled:
            item = listed_item(self.models, name)
            if item is None:
                names = ", ".join(i.name for i in self.models.listing())
                raise ModelNotFound(f"models/{name} is not found: the models are {names}")
            return jsonify(self.listed_card(item, shown_name(item, name)))
        info = self.models.default_service.info()
        if name not in info.names:
            raise ModelNotFound(f"models/{name} is not found")
        return jsonify(self.model_card(info, name))


# ---- embeddings ---------------------------------------------------------------------------------


class GeminiEmbed(EmbeddingApi):
    """``embedContent`` (``{"content": {"parts": [{"text"}]}, "taskType", "title",
    "outputDimensionality"}`` -> ``{"embedding": {"values"}}``) and ``batchEmbedContents``
    (``{"requests": [...]}`` -> ``{"embeddings": [...]}``: Facts.params ``batch``), over the
    embedding core; a task type's prefix (EMBEDDING_TASK_PREFIXES) as on Vertex's embedding
    instances."""

    name = "gemini_embed"
    paths = ()
    request_formats = ("gemini_embed",)

    def requested_model(self, body: Any, facts: Facts) -> str | None:
        return named_model(body, facts.params) or None

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return error_body(err)

    @staticmethod
    def _one(req: Any, where: str, prefixes: dict[str, str]) -> tuple[str, int | None]:
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
        return prefixes.get(task, "") + text, dims

    def parse(self, body: Any, facts: Facts) -> tuple[EmbedInput, bool]:
        """The input, and whether it is a batch. The model is the route's, else (a predict
        instance) the body's."""
        batch = bool(facts.params.get("batch"))
        model = named_model(body, facts.params)
        prefixes = self.settings_of(facts).embedding_task_prefixes  # its model's
        if batch:
            body = parsing.check_keys(body, "", frozenset({"requests"}), {}, {})
            reqs = parsing.get(body, "requests")
            if not isinstance(reqs, list) or not reqs:
                raise BadRequest("requests: a non-empty list", param="requests")
            items = [self._one(r, f"requests.{i}", prefixes) for i, r in enumerate(reqs)]
        else:
            items = [self._one({k: v for k, v in body.items() if k != "model"}
                               if isinstance(body, dict) else body, "", prefixes)]
        dims = {d for _, d in items}
        if len(dims) > 1:
            raise BadRequest("requests: one outputDimensionality for all", param="requests")
        return EmbedInput(tuple(t for t, _ in items), model=model or None,
                          dimensions=dims.pop(), truncate=True), batch

    def render(self, req: bool, result: EmbedResult) -> dict[str, Any]:
        vectors = [{"values": v.values.tolist()} for v in result.items if isinstance(v, Vector)]
        return {"embeddings": vectors} if req else {"embedding": vectors[0]}

    def floats(self, answer: dict[str, Any]) -> int:
        values = answer["embeddings"] if "embeddings" in answer else [answer["embedding"]]
        return sum(len(v["values"]) for v in values)

    def embed(self, model: str, batch: bool) -> Response:
        facts = self.facts(request.headers, model=model, batch=batch)
        return self.respond(self.serve(read_body(), facts))

    def blueprint(self, bp: Blueprint) -> None:
        for prefix in PREFIXES:
            bp.add_url_rule(f"{prefix}:embedContent", f"gemini:{prefix}:embed",
                            lambda model, **kw: self.embed(model, False), methods=["POST"])
            bp.add_url_rule(f"{prefix}:batchEmbedContents", f"gemini:{prefix}:batch",
                            lambda model, **kw: self.embed(model, True), methods=["POST"])
