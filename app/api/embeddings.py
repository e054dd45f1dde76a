"""The embedding seam (:class:`EmbeddingApi`), and two of its APIs: OpenAI's ``/v1/embeddings``
and Vertex AI's text-embedding instances (Gemini's and Ollama's are in their packages).

Every embedding API is an adapter over app.core.embed, so a text gets the same vector through
any of them. OpenAI's route answers a request as a whole (one bad input is the request's 400, as
OpenAI does); Vertex's instances answer one slot each, as Google's own embedding models do, so a
predict envelope of instances is embedded as one batch and a bad instance fails only its own
slot.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import gevent
import numpy as np
from flask import Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from app.api.base import Answer, Api, Facts, json_off_hub
from app.base import reqctx
from app.base.errors import BadRequest, ServiceError, as_service_error
from app.core.embed import Embeddings, EmbedInput, EmbedResult, Vector
from app.core.service import Service
from app.protocol import openai, validate
from app.protocol.http_status import status_of

# Token ids are ints, never bools or floats; texts are strings, never numbers.
TokenList = Annotated[list[StrictInt], Field(min_length=1)]
OFFLOAD_FLOATS = 20_000  # answers with more values than this are encoded off the hub


class EmbeddingApi(Api):
    """An embedding API: a body parsed (off the hub) into the core's EmbedInput, embedded, and
    the result rendered, on one answer path; never streamed. A large answer (a 2,048-input
    one is megabytes of floats) is rendered and encoded off the hub. Subclasses implement
    ``parse``, ``render``, ``floats`` and ``error_body``."""

    def embeddings(self, service: Service) -> Embeddings:
        """The embedding core over a leased model's service, with that model's normalization
        and input limit (a few attributes: made per call)."""
        settings = self.model_settings(service)
        return Embeddings(
            service,
            normalize=settings.embedding_normalize,
            max_inputs=settings.embedding_max_inputs,
            timeout=self.settings.request_timeout or None,
        )

    def parse(self, body: Any, facts: Facts) -> tuple[EmbedInput, Any]:
        """The core's input and whatever ``render`` needs of the request (a worker thread)."""
        raise NotImplementedError

    def render(self, req: Any, result: EmbedResult) -> dict[str, Any]:
        raise NotImplementedError

    def floats(self, answer: dict[str, Any]) -> int:
        """How many numbers an answer holds: past OFFLOAD_FLOATS it is encoded off the hub."""
        raise NotImplementedError

    def failed(self, result: EmbedResult, err: ServiceError) -> ServiceError:
        """The error a request answers when one of its inputs failed (``err``, the first)."""
        return err

    def answer(self, body: Any, facts: Facts) -> dict[str, Any]:
        # validating up to MAX_BODY_BYTES of token ids, and listing a thousand vectors' floats,
        # are done on a worker thread: on the hub they would pause every stream
        lease, facts = self.lease(body, facts)
        with lease:
            svc = lease.service
            inp, req = svc.offload(lambda: self.parse(body, facts))
            result = self.embeddings(svc).run(inp, facts.gone, facts.label)
            err = result.first_error()
            if err is not None:
                raise self.failed(result, err)
            if len(result.items) > 64:
                return svc.offload(lambda: self.render(req, result))
            return self.render(req, result)

    def respond(self, result: Answer) -> Response:
        if isinstance(result, dict) and self.floats(result) > OFFLOAD_FLOATS:
            return json_off_hub(result)
        return super().respond(result)


class OpenAIEmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: StrictStr | Annotated[list[StrictStr], Field(min_length=1)] | TokenList | Annotated[
        list[TokenList], Field(min_length=1)]
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: StrictStr | None = None  # accepted, not used


UNSUPPORTED: dict[str, str] = {
    "embd_normalize": "normalization is the server's EMBEDDING_NORMALIZE setting",
    "content": "this is the OpenAI route: send 'input' (Vertex instances use 'content')",
}


class OpenAIEmbeddings(EmbeddingApi):
    name = "embeddings_openai"
    paths = ("/v1/embeddings",)
    request_formats = ("openai_embeddings", "/v1/embeddings", "/embeddings")

    def looks_like(self, body: dict[str, Any]) -> bool:
        """A raw body is OpenAI's when it has ``input`` and a field only embeddings have
        (otherwise ``input`` alone is a Responses request)."""
        return "input" in body and ("encoding_format" in body or "dimensions" in body)

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        return openai.error_body(err)

    def parse(self, body: Any, facts: Facts) -> tuple[EmbedInput, OpenAIEmbeddingsRequest]:
        req: OpenAIEmbeddingsRequest = validate.parse(OpenAIEmbeddingsRequest, body, UNSUPPORTED)
        raw = req.input
        if isinstance(raw, str) or (raw and isinstance(raw[0], int)):
            inputs: tuple[str | tuple[int, ...], ...] = (_one(raw),)  # type: ignore[arg-type]
        else:
            inputs = tuple(_one(x) for x in raw)  # type: ignore[union-attr]
        for i, item in enumerate(inputs):
            if item == "":
                raise BadRequest(f"input[{i}] is an empty string: there is nothing to embed",
                                 param="input")
        return EmbedInput(inputs, model=req.model, dimensions=req.dimensions), req

    def failed(self, result: EmbedResult, err: ServiceError) -> ServiceError:
        """The input at fault named, when there are several."""
        if len(result.items) > 1:
            i = result.items.index(err)
            return type(err)(f"input[{i}]: {err.message}", param="input", code=err.code)
        return err

    def floats(self, answer: dict[str, Any]) -> int:
        return sum(len(d.get("embedding", ())) for d in answer.get("data", ()))

    def render(self, req: OpenAIEmbeddingsRequest, result: EmbedResult) -> dict[str, Any]:
        encode = _base64 if req.encoding_format == "base64" else _floats
        data = []
        for i, vec in enumerate(result.items):
            assert isinstance(vec, Vector)
            data.append({"object": "embedding", "index": i, "embedding": encode(vec.values)})
        return {
            "object": "list",
            "data": data,
            "model": result.model,
            "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        }


def _one(item: str | list[int]) -> str | tuple[int, ...]:
    return item if isinstance(item, str) else tuple(item)


def _floats(values: np.ndarray) -> list[float]:
    return values.tolist()  # each float32 exactly; a JSON reader gets the same float32 back


def _base64(values: np.ndarray) -> str:
    """Little-endian float32 bytes, as OpenAI's SDK decodes them."""
    return base64.b64encode(values.astype("<f4").tobytes()).decode("ascii")


# ---- Vertex AI text-embedding instances ------------------------------------------------------

TASK_TYPES = (
    "RETRIEVAL_QUERY", "RETRIEVAL_DOCUMENT", "SEMANTIC_SIMILARITY", "CLASSIFICATION",
    "CLUSTERING", "QUESTION_ANSWERING", "FACT_VERIFICATION", "CODE_RETRIEVAL_QUERY",
)

# Google's error statuses by HTTP status (google.rpc.Code), for the instance slots.
GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
    503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}


# what an envelope's instances embedded together share: model, autoTruncate, dimensions
_Group = tuple[str | None, bool, int | None]


class VertexInstance(BaseModel):
    """One instance, with the envelope's parameters merged in (instance keys win)."""

    model_config = ConfigDict(extra="forbid")

    content: StrictStr
    model: StrictStr | None = None  # the model to embed with (several served: see Models)
    task_type: StrictStr | None = None
    title: StrictStr | None = None
    autoTruncate: StrictBool = True  # noqa: N815 - the wire's name
    outputDimensionality: StrictInt | None = None  # noqa: N815


class VertexEmbeddings(EmbeddingApi):
    """``{"instances": [{"content", "task_type"?, "title"?}], "parameters": {"autoTruncate"?,
    "outputDimensionality"?}}`` -> ``{"predictions": [{"embeddings": {"values", "statistics":
    {"token_count", "truncated"}}}]}``, as Google's text-embedding models answer."""

    name = "embeddings"
    paths = ()
    answers_many = True
    request_formats = ("text_embeddings", "text-embedding", "vertex_embeddings")

    def looks_like(self, body: dict[str, Any]) -> bool:
        return (isinstance(body.get("content"), str)
                and not {"messages", "prompt", "input"} & body.keys())

    @staticmethod
    def error_body(err: ServiceError) -> dict[str, Any]:
        """Google's error object (google.rpc.Status as JSON)."""
        status = status_of(err)
        return {"error": {"code": status, "message": err.message,
                          "status": GOOGLE_STATUS.get(status, "UNKNOWN")}}

    def parse(self, body: Any, facts: Facts) -> tuple[EmbedInput, VertexInstance]:
        """The instance's text without its task's prefix: that is its model's
        (EMBEDDING_TASK_PREFIXES), added once the model is leased (:meth:`answer_many`)."""
        inst: VertexInstance = validate.parse(VertexInstance, body)
        task = inst.task_type
        if task is not None and task.upper() not in TASK_TYPES:
            raise BadRequest(f"task_type: {task!r} is not one of {', '.join(TASK_TYPES)}",
                             param="task_type")
        if inst.title is not None and (task or "").upper() != "RETRIEVAL_DOCUMENT":
            raise BadRequest("title: only valid with task_type RETRIEVAL_DOCUMENT",
                             param="title")
        if not inst.content:
            raise BadRequest("content is empty: there is nothing to embed", param="content")
        text = inst.content if inst.title is None else f"{inst.title}\n\n{inst.content}"
        return EmbedInput((text,), model=inst.model, dimensions=inst.outputDimensionality,
                          truncate=inst.autoTruncate), inst

    def floats(self, answer: dict[str, Any]) -> int:
        return 0  # one instance's vector, or an envelope's (encoded by the predict route)

    def answer(self, body: Any, facts: Facts) -> dict[str, Any]:
        """One instance on its own (a raw body through rawPredict): its slot, or its error."""
        slot = self.answer_many([body], facts)[0]
        if "error" in slot:
            raise _SlotError(slot)
        return slot

    def error_response(self, exc: BaseException) -> Response:
        if isinstance(exc, _SlotError):
            resp = super().respond(exc.slot)
            resp.status_code = exc.slot["error"]["code"]
            return resp
        return super().error_response(exc)

    def answer_many(self, bodies: list[Any], facts: Facts) -> list[dict[str, Any]]:
        """The instances of one envelope, embedded together: one request per distinct
        (model, autoTruncate, outputDimensionality), which is one request in practice, each
        holding its model while it runs; a bad instance fails only its own slot (the one
        answer path of EmbeddingApi fails the whole)."""
        slots: list[dict[str, Any] | None] = [None] * len(bodies)
        groups: dict[_Group, list[tuple[int, str, str]]] = {}  # (slot, text, task type)
        for i, body in enumerate(bodies):
            try:
                inp, inst = self.parse(body, facts)
            except Exception as exc:  # noqa: BLE001 - a bad instance fails its own slot
                slots[i] = self.error_body(as_service_error(exc))
                continue
            key = (inp.model, inp.truncate, inp.dimensions)
            groups.setdefault(key, []).append((i, str(inp.inputs[0]),
                                               (inst.task_type or "").upper()))

        def run(key: _Group, members: list[tuple[int, str, str]]) -> None:
            model, truncate, dims = key
            try:
                with self.models.lease(model or None) as lease:
                    prefixes = self.model_settings(lease.service).embedding_task_prefixes
                    inp = EmbedInput(tuple(prefixes.get(task, "") + text
                                           for _, text, task in members),
                                     model=model, truncate=truncate, dimensions=dims)
                    result = self.embeddings(lease.service).run(inp, facts.gone, facts.label)
            except Exception as exc:  # noqa: BLE001 - a request-wide error fills its slots
                err = self.error_body(as_service_error(exc))
                for i, _, _ in members:
                    slots[i] = err
                return
            for (i, _, _), item in zip(members, result.items, strict=True):
                slots[i] = (self.error_body(item) if isinstance(item, ServiceError)
                            else _prediction(item))

        gevent.joinall([gevent.spawn(reqctx.carry(run), k, m) for k, m in groups.items()],
                       raise_error=True)
        return [s for s in slots if s is not None]


class _SlotError(Exception):
    """A raw instance's error slot, answered with its status."""

    def __init__(self, slot: dict[str, Any]):
        super().__init__(slot["error"]["message"])
        self.slot = slot


def _prediction(vec: Vector) -> dict[str, Any]:
    return {"embeddings": {"values": _floats(vec.values),
                           "statistics": {"token_count": vec.tokens, "truncated": vec.truncated}}}
