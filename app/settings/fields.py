"""What every settings part shares: how a field names its env vars, and the value types and
defaults more than one part or consumer reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices

from app import formats

DEFAULT_CACHE_DIR = Path("/tmp/vertex-gguf")
# TOOL_FORMAT's values: auto, or a format of the registry (a new format needs no edit here)
ToolFormatName = Literal[("auto", *formats.FORMATS)]  # type: ignore[valid-type]
# REASONING_FORMAT: a mode, or the name of a thought syntax (parsed, written that way)
ReasoningFormatName = Literal[(*formats.REASONING_MODES, *formats.REASONING)]  # type: ignore[valid-type]
# the KV cache types llama-server's -ctk/-ctv take
UNQUANTIZED_KV = ("f32", "f16", "bf16")
KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


def env(*names: str) -> dict[str, Any]:
    """Field kwargs reading the env vars ``names`` (first set one wins)."""
    return {"validation_alias": AliasChoices(*names)}
