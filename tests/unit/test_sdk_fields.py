"""Every request field the installed official SDKs define (openai-python's Chat Completions,
Completions and Responses parameters; anthropic-python's Messages parameters, its beta's too;
google-genai's generation config) is
accounted for: implemented (a field of the request model), ignored on purpose (the API's
IGNORED table: accepted, changes nothing here), or refused on purpose (its UNSUPPORTED table: a
400 saying why). Each ignored or refused field is named in that API's docs. Bumping an SDK that
adds a field fails here until the field is placed in one of the three."""

from __future__ import annotations

from pathlib import Path

import pytest
from anthropic.types import message_create_params as anthropic_params
from anthropic.types.beta import message_create_params as anthropic_beta_params
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params

from app.api.anthropic import parsing as anthropic
from app.api.responses import parsing as responses
from app.protocol import openai

DOCS = Path(__file__).resolve().parents[2] / "docs"

CASES = {
    "chat": (chat_params.CompletionCreateParamsBase, openai.ChatRequest, openai.UNSUPPORTED,
             openai.IGNORED, "api.md"),
    "completions": (completion_create_params.CompletionCreateParamsBase, openai.CompletionRequest,
                    openai.UNSUPPORTED, openai.IGNORED, "api.md"),
    "responses": (response_create_params.ResponseCreateParamsBase, responses.ResponsesRequest,
                  responses.UNSUPPORTED, responses.IGNORED, "responses.md"),
    "messages": (anthropic_params.MessageCreateParamsBase, anthropic.MessagesRequest,
                 anthropic.UNSUPPORTED, anthropic.IGNORED, "anthropic.md"),
    "messages (beta)": (anthropic_beta_params.MessageCreateParamsBase, anthropic.MessagesRequest,
                        anthropic.UNSUPPORTED, anthropic.IGNORED, "anthropic.md"),
}


def sdk_fields(params: type) -> set[str]:
    out: set[str] = set()
    for cls in params.__mro__:
        out |= set(getattr(cls, "__annotations__", {}))
    return out


@pytest.mark.parametrize("api", sorted(CASES))
def test_every_sdk_field_is_placed(api):
    params, model, refused, ignored, _ = CASES[api]
    fields = sdk_fields(params)
    assert len(fields) > 10, "the SDK's parameters were not found"
    unplaced = sorted(f for f in fields
                      if f not in model.model_fields and f not in ignored and f not in refused)
    assert not unplaced, (
        f"{api}: the SDK defines {unplaced}, which this server neither implements nor lists "
        "as ignored (IGNORED) or refused (UNSUPPORTED)")
    both = sorted(set(ignored) & set(refused))
    assert not both, f"{api}: {both} both ignored and refused"


def test_every_gemini_generation_config_field_is_placed():
    """google-genai's GenerationConfig, the wire's generationConfig (in camelCase)."""
    from google.genai import types as gemini_types

    from app.api.gemini import parsing as gemini

    fields = {gemini.camel(f) for f in gemini_types.GenerationConfig.model_fields}
    placed = gemini.CONFIG_FIELDS | set(gemini.CONFIG_IGNORED) | set(gemini.CONFIG_UNSUPPORTED)
    assert len(fields) > 10 and not fields - placed, sorted(fields - placed)
    text = (DOCS / "gemini.md").read_text()
    missing = sorted(f for f in (*gemini.CONFIG_IGNORED, *gemini.CONFIG_UNSUPPORTED,
                                 *gemini.IGNORED, *gemini.UNSUPPORTED) if f"`{f}`" not in text)
    assert not missing, f"docs/gemini.md does not name {missing}"


@pytest.mark.parametrize("api", sorted(CASES))
def test_ignored_and_refused_fields_are_in_the_docs(api):
    params, _, refused, ignored, page = CASES[api]
    text = (DOCS / page).read_text()
    missing = sorted(f for f in (*ignored, *(r for r in refused if r in sdk_fields(params)))
                     if f"`{f}`" not in text)
    assert not missing, f"docs/{page} does not name {missing}"
