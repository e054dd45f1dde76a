"""What a request brings besides text: images and sound (MMPROJ, and the limits on reading them),
and embeddings (their context, pooling, task prefixes). One part of app.settings.Settings.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from app.settings.fields import env


class InputSettings(BaseModel):
    """What a request brings besides text."""

    # --- vision ------------------------------------------------------------------------------
    mmproj: str | None = Field(
        None,
        description="The model's vision projector (llama-server's --mmproj): an mmproj GGUF's "
        "path, file:// or gs:// URI. Unset: the one mmproj*.gguf in the model's directory "
        "(local or gs://), if there is one; none: no projector. With one, chat requests may "
        "carry images (docs/vision.md).",
        min_length=1,
        **env("MMPROJ"),
    )
    mmproj_offload: bool = Field(
        True,
        description="Run the projector on the GPU when the model's layers are there "
        "(llama-server's --no-mmproj-offload is false here).",
        **env("MMPROJ_OFFLOAD"),
    )
    image_cache_mb: int = Field(
        256,
        description="Memory for the projector's output of recent images (MiB; 0: none): an "
        "image sent again by the same API key skips the vision encoder. Its prompt KV is "
        "reused apart from this, by the prefix cache.",
        ge=0,
        le=1 << 20,
        **env("IMAGE_CACHE_MB"),
    )
    audio_max_seconds: float = Field(
        60.0,
        description="Longest sound a request may send (input_audio, WAV), read from its "
        "header before its samples; longer is a 400. Speech encoders hear 30 s per chunk.",
        gt=0,
        le=3600,
        **env("AUDIO_MAX_SECONDS"),
    )
    image_buckets: str | None = Field(
        None,
        description="Buckets whose objects a request may name as a gs:// image URL, "
        "comma-separated (read with the server's own credentials). Unset: gs:// image URLs "
        "are refused.",
        min_length=1,
        **env("IMAGE_BUCKETS"),
    )
    image_url_hosts: str | None = Field(
        None,
        description="Hosts a request may name in an http(s) image URL, comma-separated "
        "(exact names; no redirects are followed). Unset: http(s) image URLs are refused.",
        min_length=1,
        **env("IMAGE_URL_HOSTS"),
    )
    image_fetch_timeout: float = Field(
        10.0,
        description="Seconds to read one image named by URL.",
        gt=0,
        le=300,
        **env("IMAGE_FETCH_TIMEOUT"),
    )
    images_per_request: int = Field(
        8,
        description="Most images in one request; more is a 400.",
        ge=1,
        le=256,
        **env("IMAGES_PER_REQUEST"),
    )
    image_max_bytes: int = Field(
        8 * 1024 * 1024,
        description="Largest image in bytes (as sent, before base64); larger is a 413. A "
        "request's body is bounded by MAX_BODY_BYTES first.",
        ge=1024,
        le=1 << 30,
        **env("IMAGE_MAX_BYTES"),
    )
    image_max_pixels: int = Field(
        25_000_000,
        description="Most pixels an image may declare (width x height, read from its header "
        "before anything is decoded); more is a 400. Bounds one image's decoding memory (up "
        "to 8 bytes a pixel: a small file can claim an enormous image); 25 M takes a 24 MP "
        "photo, and projectors see a few hundred pixels a side.",
        ge=1,
        le=1 << 31,
        **env("IMAGE_MAX_PIXELS"),
    )
    image_decode_budget: int = Field(
        512 * 1024 * 1024,
        description="Bytes of decoded pixels all of a worker's requests may hold at once; an "
        "image past it waits for room, up to half of PREPARE_TIMEOUT, then its request is a "
        "429. One image alone always decodes. Bounds decoding memory per worker, not per image.",
        ge=16 * 1024 * 1024,
        le=1 << 40,
        **env("IMAGE_DECODE_BUDGET"),
    )
    image_max_side: int = Field(
        2048,
        description="Images are scaled down (aspect kept) until neither side is longer, "
        "before the projector sees them: projectors work at a few hundred pixels, so a large "
        "photo costs no more than a small one.",
        ge=16,
        le=16384,
        **env("IMAGE_MAX_SIDE"),
    )

    # --- embeddings --------------------------------------------------------------------------
    embeddings: Literal["auto", "on", "off", "only"] = Field(
        "auto",
        description="Embeddings (/v1/embeddings, Vertex embedding instances) run in a context "
        "of their own beside generation, so they never wait behind it. auto: an embedding GGUF "
        "(non-causal, or with a pooling type in its metadata) embeds only, and the chat routes "
        "answer 400; a generative one does not embed (its embedding context costs memory: see "
        "EMBEDDING_CTX). on: both. off: none. only: embeddings, no generation context.",
        **env("EMBEDDINGS"),
    )
    embedding_pooling: Literal["auto", "mean", "cls", "last", "none"] = Field(
        "auto",
        description="How a text's token vectors become one: auto (the GGUF's pooling type, else "
        "mean), mean, cls (first token) or last (last token: decoder embedding models). none "
        "gives one vector per token, which /v1/embeddings refuses with a 400.",
        **env("EMBEDDING_POOLING"),
    )
    embedding_ctx: int = Field(
        0,
        description="Most tokens of one embedding input, and of one embedding batch (0: the "
        "model's training context, at most 8192 for an embedding model and 2048 for a "
        "generative one, whose output layer llama.cpp also runs: its compute buffer holds this "
        "many tokens x the vocabulary in floats). Longer inputs are refused with a 400, or cut "
        "when the request asks (Vertex autoTruncate).",
        ge=0,
        le=1_048_576,
        **env("EMBEDDING_CTX"),
    )
    embedding_batch: int = Field(
        64,
        description="Most inputs embedded together in one decode (from one request or many).",
        ge=1,
        le=256,
        **env("EMBEDDING_BATCH"),
    )
    embedding_normalize: bool = Field(
        True,
        description="L2-normalize embeddings (after cutting them to 'dimensions'): cosine "
        "similarity is then a dot product, as OpenAI's embeddings are.",
        **env("EMBEDDING_NORMALIZE"),
    )
    embedding_max_inputs: int = Field(
        2048,
        description="Most inputs (or Vertex instances) in one embedding request.",
        ge=1,
        le=100_000,
        **env("EMBEDDING_MAX_INPUTS"),
    )
    embedding_task_prefixes: dict[str, str] = Field(
        default_factory=dict,
        description="Text put before a Vertex embedding instance's content for its task_type, "
        'as JSON (e.g. {"RETRIEVAL_QUERY": "query: ", "RETRIEVAL_DOCUMENT": "passage: "} for '
        "E5 models). Empty: task_type is checked, then ignored.",
        json_schema_extra={"default_label": "{}"},
        **env("EMBEDDING_TASK_PREFIXES"),
    )

    @field_validator("embedding_task_prefixes", mode="before")
    @classmethod
    def _json_map(cls, value: Any) -> Any:
        """The flag gives a JSON string (the env var is parsed as JSON already)."""
        if isinstance(value, str):
            import json

            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not valid JSON: {exc}") from None
        return value
