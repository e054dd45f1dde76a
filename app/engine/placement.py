"""Where the model's tensors and its KV cache go: the KV cache's data types (KV_CACHE_TYPE_K,
KV_CACHE_TYPE_V) and tensor buffer overrides (OVERRIDE_TENSOR, CPU_MOE, N_CPU_MOE).

llama.cpp takes overrides as a NULL-terminated array of ``{pattern, buffer type}`` that
llama-cpp-python declares as an untyped pointer, and names buffer types through ggml's backend
registry, which it does not bind: both are built here with ctypes, over the same shared
libraries llama-cpp-python loaded.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from app.base.errors import ModelLoadError

# ggml_type by name: the KV cache types llama-server's -ctk/-ctv take
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
              "iq4_nl": 20, "bf16": 30}
# llama-server's LLM_FFN_EXPS_REGEX: a mixture-of-experts layer's expert tensors
EXPERTS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


class _Override(ctypes.Structure):
    """llama.h's ``struct llama_model_tensor_buft_override``."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass(frozen=True)
class Rule:
    """One override: tensors whose name matches ``pattern`` go to buffer type ``buft``."""

    pattern: str
    buft: str


def rules(override_tensor: str | None, cpu_moe: bool, n_cpu_moe: int) -> list[Rule]:
    """The overrides in the order llama.cpp tries them (the first match wins): OVERRIDE_TENSOR's
    pairs, then CPU_MOE's pattern, then N_CPU_MOE's one per layer (llama-server's order)."""
    out = []
    for pair in (override_tensor or "").split(","):
        pattern, eq, buft = pair.strip().partition("=")
        if eq:
            out.append(Rule(pattern, buft.strip()))
    if cpu_moe:
        out.append(Rule(EXPERTS, "CPU"))
    out.extend(Rule(rf"blk\.{i}{EXPERTS}", "CPU") for i in range(n_cpu_moe))
    return out


class Overrides:
    """The ctypes array for ``llama_model_params.tensor_buft_overrides``, alive as long as this
    object (llama.cpp reads it while loading). The patterns are valid: OVERRIDE_TENSOR's are
    checked with the settings, the others are this module's."""

    def __init__(self, ll, chosen: list[Rule]):
        types = buffer_types(ll)
        unknown = sorted({r.buft for r in chosen if r.buft not in types})
        if unknown:
            raise ModelLoadError(
                f"OVERRIDE_TENSOR names the buffer type {', '.join(unknown)}, which this "
                f"machine does not have; it has {', '.join(sorted(types))}")
        self._patterns = [r.pattern.encode() for r in chosen]
        self.array = (_Override * (len(chosen) + 1))(
            *(_Override(p, types[r.buft]) for p, r in zip(self._patterns, chosen, strict=True)),
            _Override(None, None),
        )

    @property
    def pointer(self) -> int:
        return ctypes.addressof(self.array)


def buffer_types(ll) -> dict[str, int]:
    """Every device's buffer type by name (CPU, CUDA0, ...), as llama-server's -ot reads them.
    "CPU" is ggml's CPU buffer type itself: the one llama.cpp compares against to keep using
    its repacked CPU layouts for an overridden tensor."""
    ggml = _ggml(ll)
    out: dict[str, int] = {}
    for i in range(ggml.ggml_backend_dev_count()):
        buft = ggml.ggml_backend_dev_buffer_type(ggml.ggml_backend_dev_get(i))
        if buft:
            out[ggml.ggml_backend_buft_name(buft).decode()] = buft
    out["CPU"] = ggml.ggml_backend_cpu_buffer_type()
    return out


def _ggml(ll) -> ctypes.CDLL:
    """ggml's functions, looked up through the libllama ``ll`` loaded, so they are the very
    ggml it uses. (Opening libggml-base.so by path would load a second copy: the wheel ships
    the unversioned names as copies, not links, and the copy's CPU buffer type is not the one
    llama.cpp compares against.)"""
    lib = getattr(getattr(ll, "llama_cpp", ll), "_lib", None)
    if lib is None or not getattr(lib, "_handle", None):
        raise ModelLoadError("tensor overrides need llama-cpp-python's shared libraries")
    ggml = ctypes.CDLL(lib._name, handle=lib._handle)  # its own function objects, one library
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_buft_name.restype = ctypes.c_char_p
    ggml.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    ggml.ggml_backend_cpu_buffer_type.argtypes = []
    return ggml
