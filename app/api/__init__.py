"""The wire APIs, each one module over the neutral core (app.core).

An API is a subclass of a seam (app.api.generation.GenerationApi,
app.api.embeddings.EmbeddingApi or app.api.rerank.RerankApi) in its own module, listed once in ``APIS``: that mounts its
routes with its own error shape, makes it reachable through the Vertex predict route (by
``@requestFormat`` or, for a raw body, by its fields: the APIs are asked in this order, so the
one with the most distinctive fields comes first), and lets it claim the shared model routes
for its clients (:func:`speaker`).
"""

from __future__ import annotations

from collections.abc import Mapping

from flask import Flask

from app.api.anthropic import Messages
from app.api.base import Api
from app.api.embeddings import OpenAIEmbeddings, VertexEmbeddings
from app.api.gemini import Gemini, GeminiEmbed
from app.api.ollama import OllamaChat, OllamaEmbed, OllamaGenerate
from app.api.openai import ChatCompletions, Completions
from app.api.rerank import CohereV1, CohereV2, Rerank, Score
from app.api.responses import Responses
from app.api.vertex import Predict
from app.core.models import Models
from app.settings import Settings, slots_per_request

APIS: list[type[Api]] = [
    Messages, OpenAIEmbeddings, CohereV1, Rerank, CohereV2, Score, Gemini, OllamaChat,
    OllamaGenerate, Responses, ChatCompletions, Completions, VertexEmbeddings, OllamaEmbed,
    GeminiEmbed,
]
# The APIS setting's names for them (an API's embedding route goes with its family, so
# APIS=ollama serves /api/embed too; "embeddings" is OpenAI's and Vertex's).
FAMILIES: dict[type[Api], str] = {
    Messages: "anthropic", OpenAIEmbeddings: "embeddings", Gemini: "gemini",
    OllamaChat: "ollama", OllamaGenerate: "ollama", Responses: "responses",
    ChatCompletions: "openai", Completions: "openai", VertexEmbeddings: "embeddings",
    OllamaEmbed: "ollama", GeminiEmbed: "gemini", CohereV1: "rerank", Rerank: "rerank",
    CohereV2: "rerank", Score: "rerank",
}


def speaker(headers: Mapping[str, str]) -> type[Api] | None:
    """The API whose clients sent a request on a route several APIs share (GET /v1/models):
    the first in the registry that claims its headers (Api.speaks); None: OpenAI's."""
    return next((cls for cls in APIS if cls.speaks(headers)), None)


def served(settings: Settings) -> list[type[Api]]:
    """The APIs the APIS setting asks for, in the registry's order."""
    wanted = set(settings.apis.split(","))
    return [cls for cls in APIS if "all" in wanted or FAMILIES[cls] in wanted]


def register(app: Flask, settings: Settings, models: Models) -> list[Api]:
    """Every served API's routes and the predict route, each request on the model it names."""
    apis = [cls(settings, models) for cls in served(settings)]
    app.extensions["vertex_gguf_apis"] = apis
    for api in apis:
        app.register_blueprint(api.make_blueprint())
    predict = Predict(apis, models, settings.max_instances, slots_per_request(settings))
    app.add_url_rule(settings.predict_route, "predict", predict.view, methods=["POST"])
    return apis
