"""The Vertex AI predict route: envelopes of instances, and raw bodies of any API.

An envelope's instances run concurrently, at most SLOTS_PER_REQUEST at a time, each through the
API it names (``@requestFormat``) or whose fields it has, on the model it names as that API
reads it (Api.requested_model; none: the default model); a failing instance's error fills its
own slot, in that API's error shape, an unknown model's 404 included. A raw body (rawPredict, streamRawPredict) is answered
exactly as the matching API's own route would answer it, errors included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import gevent
import gevent.pool
from flask import Response, jsonify, request

from app.api import streams
from app.api.base import (
    Answer,
    Api,
    Facts,
    LargeAnswer,
    error_response,
    gone_probe,
    json_off_hub,
    read_body,
)
from app.base import reqctx
from app.base.errors import BadRequest, ClientGone, ServiceError, as_service_error
from app.base.metrics import PREDICT
from app.core.models import Models
from app.protocol import openai, vertex


class Predict:
    def __init__(self, apis: list[Api], models: Models, max_instances: int,
                 slots_per_request: int):
        self.apis = {a.name: a for a in apis}
        self.models = models
        self.max_instances = max_instances
        self.slots_per_request = slots_per_request
        names: dict[str, str] = {}
        for a in apis:
            for fmt in (a.name, *a.request_formats, *a.paths):
                names[fmt.lower()] = a.name
        hint = ", ".join(repr(f) for a in apis for f in a.request_formats[:1] + a.paths[:1])
        self.formats = vertex.Formats(names, self._detect, hint)

    @staticmethod
    def facts(api: Api, headers: Mapping[str, str],
              gone: Callable[[], bool] | None) -> Facts:
        """A request to ``api`` through this route: counted in the metrics as the predict
        route's."""
        return replace(api.facts(headers, gone), label=PREDICT)

    def _detect(self, body: dict[str, Any]) -> str | None:
        for api in self.apis.values():  # in registry order: the more specific first
            if api.looks_like(body):
                return api.name
        return None

    def view(self) -> Response:
        api: Api | None = None
        try:
            body = read_body()
            if not vertex.is_envelope(body):
                if not isinstance(body, dict):
                    raise BadRequest("request body must be a JSON object")
                resumed = streams.predict_form(body)  # the resumable-stream routes' forms
                if resumed is not None:
                    return resumed
                api = self.apis[vertex.api_of(body, self.formats)]
                api = self.apis[api.variant(vertex.strip_format(body), request.headers)]
                facts = self.facts(api, request.headers, gone_probe())
                result: Answer = api.serve(vertex.strip_format(body), facts)
                return api.respond(result)
            return self._envelope(body, request.headers)
        except Exception as exc:  # noqa: BLE001 - rendered in the shape of the API spoken
            if api is not None:
                return api.error_response(exc)
            return error_response(exc, openai.error_body)  # the envelope itself: OpenAI's shape

    def _envelope(self, body: dict[str, Any], headers: Mapping[str, str]) -> Response:
        items = [vertex.Instance(self.apis[item.api].variant(item.body, headers), item.body)
                 if isinstance(item, vertex.Instance) else item
                 for item in vertex.parse_envelope(body, self.max_instances, self.formats)]
        streams: list[vertex.Instance] = []
        for i, item in enumerate(items):
            if isinstance(item, vertex.Instance):
                api = self.apis[item.api]
                try:
                    if api.wants_stream(item.body, self.facts(api, headers, None)):
                        streams.append(item)
                except ServiceError as err:
                    items[i] = err
        if streams:
            if len(items) != 1:
                raise BadRequest(
                    f"stream: true needs exactly one instance (got {len(items)}): a stream "
                    "carries one answer; send the instances as separate requests",
                    param="instances",
                )
            api = self.apis[streams[0].api]
            try:
                return api.respond(api.serve(streams[0].body, self.facts(api, headers, None)))
            except Exception as exc:  # noqa: BLE001
                return api.error_response(exc)
        if not self.models.pooled:  # several models: each instance loads the one it names
            self.models.default_service.info()  # 503 for the whole envelope while loading
        gone = gone_probe()
        slots: list[dict[str, Any] | None] = [
            None if isinstance(item, vertex.Instance) else openai.error_body(item)
            for item in items
        ]
        # at most SLOTS_PER_REQUEST instances in the engine at once: one envelope cannot take
        # every slot (the rest wait their turn here, not in the engine's queue)
        pool = gevent.pool.Pool(self.slots_per_request)
        jobs: list[tuple[list[int], gevent.Greenlet]] = []  # positions, and their answers
        for name, indices in self._by_api(items).items():
            facts = self.facts(self.apis[name], headers, gone)
            if self.apis[name].answers_many:  # the API batches them itself (embeddings)
                group = [items[i] for i in indices]
                jobs.append((indices, gevent.spawn(reqctx.carry(self._batch), name, group,
                                                   facts)))
            else:
                # each instance in its own greenlet, in a copy of this request's context (its
                # id for log lines, its key's cache scope)
                jobs += [([i], pool.spawn(reqctx.carry(self._instance), items[i], facts))
                         for i in indices]
        gevent.joinall([j for _, j in jobs])
        for indices, job in jobs:
            for i, slot in zip(indices, job.value, strict=True):
                slots[i] = slot
        body = vertex.predictions(slots)  # type: ignore[arg-type]
        # encoding many answers (embeddings' floats), or large ones, is kept off the hub
        if len(slots) > 16 or any(isinstance(slot, LargeAnswer) for slot in slots):
            return json_off_hub(body)
        return jsonify(body)

    @staticmethod
    def _by_api(items: list) -> dict[str, list[int]]:
        """The valid instances' positions, by the API that serves them."""
        out: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            if isinstance(item, vertex.Instance):
                out.setdefault(item.api, []).append(i)
        return out

    def _batch(self, name: str, items: list[vertex.Instance],
               facts: Facts) -> list[dict[str, Any]]:
        api = self.apis[name]
        try:
            return api.answer_many([item.body for item in items], facts)
        except Exception as exc:  # noqa: BLE001 - the whole group's slots get the error
            return [api.error_body(as_service_error(exc))] * len(items)

    def _instance(self, item: vertex.Instance, facts: Facts) -> list[dict[str, Any]]:
        """One instance's answer (as a list of one, like a batch's)."""
        api = self.apis[item.api]
        try:
            if facts.gone is not None and facts.gone():
                raise ClientGone("the client went away")
            return [api.answer(item.body, facts)]
        except Exception as exc:  # noqa: BLE001 - one instance's failure stays in its slot
            return [api.error_body(as_service_error(exc))]
