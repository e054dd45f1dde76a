"""What a request brings besides text: images, sound and video (MMPROJ, and the limits on reading them),
and embeddings (their context, pooling, task prefixes). One part of app.settings.Settings.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
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
        description="Hosts a request may name in an http(s) image URL, comma-separated: "
        "exact names or addresses, each allowing its scheme's default port unless it names "
        "one (images.example.com:8443, [2001:db8::1]:8080). A name must resolve to public "
        "addresses only (else IMAGE_URL_NETWORKS); a listed address is allowed as written. "
        "No redirects are followed. Unset: http(s) image URLs are refused.",
        min_length=1,
        max_length=8192,
        **env("IMAGE_URL_HOSTS"),
    )
    image_url_networks: str | None = Field(
        None,
        description="Non-public address ranges (CIDR, comma-separated) an IMAGE_URL_HOSTS "
        "name may resolve to, for an image host inside the VPC (10.8.0.0/16). Unset: a name "
        "that resolves to a private, loopback, link-local or other non-public address is "
        "refused.",
        min_length=1,
        max_length=8192,
        **env("IMAGE_URL_NETWORKS"),
    )
    image_fetch_timeout: float = Field(
        10.0,
        description="Seconds to read one image named by URL (gs:// or http(s)): a deadline "
        "on the whole read (connection, headers and body), after which the connection is "
        "closed and the request gets a 400.",
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
    video_max_bytes: int = Field(
        64 * 1024 * 1024,
        description="Largest video in bytes (as sent, before base64, or as read from its "
        "URL); larger is a 413. A video sent inline must also fit MAX_BODY_BYTES.",
        ge=1024,
        le=1 << 34,
        **env("VIDEO_MAX_BYTES"),
    )
    video_fps: float = Field(
        1.0,
        description="Frames taken per second of video, from its start (docs/video.md); each "
        "frame goes to the projector as an image.",
        ge=0.05,
        le=30,
        **env("VIDEO_FPS"),
    )
    video_max_frames: int = Field(
        32,
        description="Most frames taken from one request's videos together: VIDEO_FPS from "
        "a video's start until this many (so the first VIDEO_MAX_FRAMES / VIDEO_FPS seconds "
        "are seen; the rest of a longer video is not read); a later video gets what the "
        "earlier ones left, and one with none left is a 400.",
        ge=1,
        le=512,
        **env("VIDEO_MAX_FRAMES"),
    )
    video_max_side: int = Field(
        768,
        description="Video frames are scaled down (aspect kept) until neither side is longer, "
        "as ffmpeg extracts them: a frame costs the projector what a small image does.",
        ge=16,
        le=4096,
        **env("VIDEO_MAX_SIDE"),
    )
    video_timeout: float = Field(
        20.0,
        description="Seconds ffmpeg may take to extract one video's frames (it also runs "
        "under 512 MiB of address space and this much CPU time); past it the child is killed "
        "and the request gets a 400. PREPARE_TIMEOUT bounds it too.",
        gt=0,
        le=600,
        **env("VIDEO_TIMEOUT"),
    )
    video_ffmpeg: str | None = Field(
        None,
        description="The ffmpeg that extracts video frames: a path, or a name looked up on "
        "PATH. Unset: the binary of the video extra (imageio-ffmpeg, which the image "
        "installs), else the ffmpeg on PATH. Whichever it is runs under the same limits.",
        **env("VIDEO_FFMPEG"),
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
    embedding_pooling: Literal["auto", "mean", "cls", "last", "none", "rank"] = Field(
        "auto",
        description="How a text's token vectors become one: auto (the GGUF's pooling type, else "
        "mean), mean, cls (first token) or last (last token: decoder embedding models). none "
        "gives one vector per token, which /v1/embeddings refuses with a 400. rank: the model "
        "is a reranker (its classification head scores pairs: /v1/rerank), for a reranker "
        "GGUF whose metadata lacks the pooling type.",
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
    # --- reranking ---------------------------------------------------------------------------
    rerank_max_documents: int = Field(
        1000,
        description="Most documents in one rerank request (or pairs in one /score request); "
        "more is a 400. Each is a sequence the reranker decodes.",
        ge=1,
        le=100_000,
        **env("RERANK_MAX_DOCUMENTS"),
    )
    rerank_max_bytes: int = Field(
        8 * 1024 * 1024,
        description="Most bytes of text in one rerank or score request (its documents and each "
        "distinct query, in UTF-8); more is a 413. Bounds the tokenizing a request costs "
        "before its first pair is decoded; MAX_BODY_BYTES bounds the body first.",
        ge=1024,
        le=1 << 30,
        **env("RERANK_MAX_BYTES"),
    )
    embedding_task_prefixes: dict[str, str] = Field(
        default_factory=dict,
        description="Text put before a Vertex embedding instance's content for its task_type, "
        'as JSON (e.g. {"RETRIEVAL_QUERY": "query: ", "RETRIEVAL_DOCUMENT": "passage: "} for '
        "E5 models). Empty: task_type is checked, then ignored.",
        json_schema_extra={"default_label": "{}"},
        **env("EMBEDDING_TASK_PREFIXES"),
    )

    @field_validator("image_url_hosts")
    @classmethod
    def _host_list(cls, value: str | None) -> str | None:
        url_hosts(value)  # raises ValueError naming the bad entry
        return value

    @field_validator("image_url_networks")
    @classmethod
    def _network_list(cls, value: str | None) -> str | None:
        url_networks(value)
        return value

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


HostEntry = tuple[str, int | None]  # (a lower-case name or a canonical address, its port or None)
_HOST_ENTRY = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::([0-9]{1,5}))?", re.ASCII)


def url_host(text: str) -> str | None:
    """A URL's host as IMAGE_URL_HOSTS compares it: a name lower-cased, an address in its
    canonical form (brackets dropped); None when it is neither."""
    text = text.lower()
    if text.startswith("["):
        try:
            return str(ipaddress.IPv6Address(text[1:-1])) if text.endswith("]") else None
        except ValueError:
            return None
    if not re.fullmatch(r"[a-z0-9.-]+", text, re.ASCII) or ".." in text or text.startswith("."):
        return None
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        return text


def url_hosts(value: str | None) -> frozenset[HostEntry]:
    """IMAGE_URL_HOSTS as (host, port) pairs; port None: the scheme's default port."""
    out: set[HostEntry] = set()
    for raw in (value or "").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        m = _HOST_ENTRY.fullmatch(entry)
        host = url_host(m.group(1)) if m else None
        port = int(m.group(2)) if m and m.group(2) else None
        if host is None:  # a bare IPv6 address has no port
            with contextlib.suppress(ValueError):
                host, port = str(ipaddress.IPv6Address(entry)), None
        if host is None or (port is not None and not 0 < port < 65536):
            raise ValueError(f"{raw.strip()!r}: IMAGE_URL_HOSTS takes host, host:port, an "
                             "address or [IPv6]:port")
        out.add((host, port))
    return frozenset(out)


def url_networks(value: str | None) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """IMAGE_URL_NETWORKS as networks."""
    out = []
    for raw in (value or "").split(","):
        if raw.strip():
            try:
                out.append(ipaddress.ip_network(raw.strip(), strict=False))
            except ValueError:
                raise ValueError(f"{raw.strip()!r}: IMAGE_URL_NETWORKS takes CIDR ranges "
                                 "(10.8.0.0/16, fd00::/8)") from None
    return tuple(out)
