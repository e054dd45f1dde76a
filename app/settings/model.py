"""What is served, and from where: the model (a local file or gs://) and its names, the chat
template, the draft model for speculative decoding, the LoRA adapters. One part of
app.settings.Settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from app.settings.fields import DEFAULT_CACHE_DIR, env


class ModelSettings(BaseModel):
    """What is served, and from where."""

    # --- model -------------------------------------------------------------------------------
    model: str | None = Field(
        None,
        description="Model to serve: a local .gguf path, directory or file:// URI, or a gs:// "
        "object or directory. Falls back to AIP_STORAGE_URI, then to the embedded default model.",
        min_length=1,
        **env("MODEL", "AIP_STORAGE_URI"),
    )
    model_cache_dir: Path = Field(
        DEFAULT_CACHE_DIR,
        description="Directory for downloaded models and the fetched default model.",
        **env("MODEL_CACHE_DIR"),
    )
    model_file: str | None = Field(
        None,
        description="Which GGUF to serve when the model directory holds several: a file name "
        "or glob (a split model is named by any of its shards).",
        min_length=1,
        **env("MODEL_FILE"),
    )
    download_workers: int = Field(
        8,
        description="Concurrent ranged downloads per object from gs://.",
        ge=1,
        le=64,
        **env("DOWNLOAD_WORKERS"),
    )
    download_slice_mb: int = Field(
        32,
        description="Size of each ranged slice in MiB; objects under two slices download in "
        "one stream.",
        ge=1,
        le=4096,
        **env("DOWNLOAD_SLICE_MB"),
    )
    storage_emulator_host: str | None = Field(
        None,
        description="Cloud Storage emulator address (tests): anonymous credentials are used "
        "only when this is set; otherwise Application Default Credentials.",
        min_length=1,
        **env("STORAGE_EMULATOR_HOST"),
    )
    served_model_name: str | None = Field(
        None,
        description="The model's names, comma-separated: the first is its id (in /v1/models), "
        "every one is an alias a request may name and have echoed in its answer's `model` "
        "(default: the file name without .gguf). Duplicates are dropped; an empty name is an "
        "error.",
        min_length=1,
        max_length=4096,
        **env("SERVED_MODEL_NAME"),
    )
    model_tags: str | None = Field(
        None,
        description="Informational tags for /v1/models and /props, comma-separated (not used "
        "to pick a model).",
        min_length=1,
        max_length=4096,
        **env("MODEL_TAGS"),
    )
    strict_model_name: bool = Field(
        False,
        description="Answer a request whose `model` is none of the aliases with a 404 "
        "model_not_found (default: serve it, answering with the id; many clients send a fixed "
        "name). A request that names no model is always served.",
        **env("STRICT_MODEL_NAME"),
    )
    slots_endpoint: Literal["auto", "on", "off"] = Field(
        "auto",
        description="GET /slots (each slot's state, prompt lengths included): on, off (a 501 "
        "as llama-server's --no-slots), or auto: on unless an API key is configured.",
        **env("SLOTS_ENDPOINT"),
    )
    chat_template: str | None = Field(
        None,
        description="Jinja chat template overriding the GGUF's own: a file path or the "
        "template text.",
        min_length=1,
        **env("CHAT_TEMPLATE"),
    )

    # --- speculative decoding ------------------------------------------------------------------
    draft_model: str | None = Field(
        None,
        description="A smaller model that drafts tokens for the model to check (speculative "
        "decoding): a path, file:// or gs:// URI, fetched and verified like MODEL. It must "
        "share the model's vocabulary (checked at load).",
        max_length=2048,
        **env("DRAFT_MODEL"),
    )
    spec_mtp: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Multi-token prediction: draft with the model's own MTP (NextN) layers "
        "(GLM-4.5+, DeepSeek V3, Hunyuan v3...), checked as any draft is. auto: on where the "
        "GGUF carries them and no DRAFT_MODEL is set; on: a start-up error where it does not.",
        **env("SPEC_MTP"),
    )
    spec_mtp_draft_max: int = Field(
        3,
        description="Most tokens the MTP layers draft per sequence per step (within "
        "SPEC_DRAFT_MAX and a request's speculative.n_max; llama-server's default 3).",
        ge=1,
        le=16,
        **env("SPEC_MTP_DRAFT_MAX"),
    )
    spec_ngram: bool = Field(
        False,
        description="Speculative decoding with no second model: draft from the sequence "
        "itself, the tokens that followed the latest earlier occurrence of its last 4, 3 or 2 "
        "tokens (prompt lookup). Strong where replies copy their prompt (code edits, RAG); "
        "with DRAFT_MODEL it drafts for the requests the draft model cannot (images).",
        **env("SPEC_NGRAM"),
    )
    spec_adaptive: bool = Field(
        True,
        description="Draft only where it pays: the engine measures, per batch width, the "
        "tokens a step emits per second with drafting and without, and drafts where that is "
        "higher (trying the other choice every 16th step). Off: draft on every step.",
        **env("SPEC_ADAPTIVE"),
    )
    spec_draft_max: int = Field(
        8,
        description="Most tokens drafted per sequence per step (a request's speculative.n_max "
        "may lower it, or set 0 to turn speculation off for itself).",
        ge=1,
        le=128,
        **env("SPEC_DRAFT_MAX"),
    )
    spec_draft_min: int = Field(
        0,
        description="A draft shorter than this is not checked (speculative.n_min per request).",
        ge=0,
        le=128,
        **env("SPEC_DRAFT_MIN"),
    )
    spec_p_min: float = Field(
        0.5,
        description="The draft model stops drafting where its own probability of its next "
        "token falls below this (speculative.p_min per request).",
        ge=0.0,
        le=1.0,
        **env("SPEC_P_MIN"),
    )

    deterministic: bool = Field(
        False,
        description="The same reply bytes for the same request (greedy, or sampled with a "
        "seed) whatever else the server runs: alone or beside other requests, after a prefix "
        "or prompt-cache hit. Each engine step then decodes one sequence (the slots take turns), "
        "prompts are decoded in PREFILL_CHUNK pieces that start at multiples of it, and a cached "
        "prefix is reused only as far as it was decoded that way. Costs throughput under "
        "concurrency (docs/deterministic.md); speculative decoding is off.",
        **env("DETERMINISTIC"),
    )

    # --- LoRA adapters -------------------------------------------------------------------------
    lora_adapters: str | None = Field(
        None,
        description="LoRA adapters loaded over the model at start: comma-separated "
        "name=path-or-gs://[:scale] (the scale when a request chooses the adapter; default 1). "
        "/v1/models lists each as a model whose parent is the base; a request picks one by "
        "naming it as its model, or with llama-server's lora field.",
        max_length=8192,
        **env("LORA_ADAPTERS"),
    )
    admin_api_key: str | None = Field(
        None,
        description="The operator key: the only key POST /lora-adapters answers to (it sets "
        "the adapter scales of every request that names none). Unset: that route is off.",
        min_length=16,
        max_length=512,
        **env("ADMIN_API_KEY"),
    )

    @field_validator("served_model_name", "model_tags")
    @classmethod
    def _name_list(cls, value: str | None) -> str | None:
        """A comma-separated list, kept normalized: parts stripped, duplicates dropped (the
        first kept), an empty part refused (``a,,b`` is a typo, not two names)."""
        if value is None:
            return None
        parts = [p.strip() for p in value.split(",")]
        if any(not p for p in parts):
            raise ValueError(f"{value!r}: a comma-separated list with an empty name in it")
        return ",".join(dict.fromkeys(parts))

    @field_validator("lora_adapters")
    @classmethod
    def _adapter_list(cls, value: str | None) -> str | None:
        if value is not None:
            lora_entries(value)  # raises ValueError naming the bad entry
        return value

    @model_validator(mode="after")
    def _deterministic_without_drafts(self) -> ModelSettings:
        """A checked draft decodes a sequence's rows in batches of the draft's length, which
        changes the numbers: DETERMINISTIC refuses the settings that draft on their own."""
        if self.deterministic and (self.spec_ngram or self.draft_model
                                   or self.spec_mtp == "on"):
            raise ValueError("DETERMINISTIC=on decodes one token per step: leave SPEC_NGRAM "
                             "off, SPEC_MTP auto or off and DRAFT_MODEL unset "
                             "(docs/deterministic.md)")
        return self


def lora_entries(value: str | None) -> list[tuple[str, str, float]]:
    """LORA_ADAPTERS as (name, source, scale) triples. A trailing ``:number`` is the scale
    (``gs://b/a.gguf:0.5``); names are unique, and plain enough to be a model name."""
    import math
    import re

    out: list[tuple[str, str, float]] = []
    for entry in value.split(",") if value else ():
        name, eq, source = entry.strip().partition("=")
        name = name.strip()
        if not eq or not name or not source.strip():
            raise ValueError(f"{entry!r}: LORA_ADAPTERS takes name=path-or-gs://[:scale]")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}", name):
            raise ValueError(f"{name!r}: an adapter's name is letters, digits and ._:/- "
                             "(it is a model name)")
        scale = 1.0
        head, colon, tail = source.strip().rpartition(":")
        if colon and head and head not in ("gs", "file"):
            try:
                scale = float(tail)
            except ValueError:
                head = ""
            if head:
                source = head
        if not math.isfinite(scale) or abs(scale) > 16:
            raise ValueError(f"{name}: scale {tail} is not a number between -16 and 16")
        if any(name == n for n, _, _ in out):
            raise ValueError(f"{name}: two adapters with one name")
        out.append((name, source.strip(), scale))
    return out
