"""LoRA adapters (LORA_ADAPTERS): loaded over the model at start, applied per step.

llama.cpp applies adapters to a whole context, not to one sequence, so sequences with
different adapter sets cannot share a decode. A request's set is a tuple of (adapter index,
scale) pairs with nonzero scales, in index order; () is the base model. The scheduler
(app.engine.scheduler) serves one set per step, taking the sets in turn, and sets the
context's adapters here only when the set changes.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

from app.base.errors import ModelLoadError

log = logging.getLogger(__name__)

LoraSet = tuple[tuple[int, float], ...]


def next_set(in_use: set[LoraSet], served: LoraSet) -> LoraSet:
    """The set a step serves after one that served ``served``: the next of those ``in_use``
    in a fixed order, round to the first, so each waits at most one step per other set."""
    later = sorted(k for k in in_use if k > served)
    return later[0] if later else min(in_use)


@dataclass(frozen=True)
class AdapterFile:
    """One LORA_ADAPTERS entry, resolved to a local file."""

    name: str
    path: str
    scale: float  # its scale when a request chooses it by name


class Adapters:
    """The loaded adapters and the set the context has now."""

    def __init__(self, ll, model, files: list[AdapterFile]):
        self.ll = ll
        self.files = files
        self.handles: list = []
        try:
            for f in files:
                handle = ll.llama_adapter_lora_init(model, f.path.encode())
                if not handle:
                    raise ModelLoadError(
                        f"LORA_ADAPTERS {f.name} ({f.path}): llama.cpp could not apply it to "
                        "this model (an adapter of another base model, or not a LoRA GGUF; "
                        "llama.cpp's log line above says which tensor)")
                self.handles.append(handle)
        except BaseException:
            self.free()
            raise
        self._array = (ll.llama_adapter_lora_p_ctypes * max(1, len(files)))(*self.handles)
        self.current: LoraSet = ()
        self.ctx = None
        log.info("LoRA adapters loaded: %s", ", ".join(f"{f.name} (scale {f.scale:g})"
                                                        for f in files))

    def apply(self, ctx, wanted: LoraSet) -> bool:
        """The context's adapters set to ``wanted`` (a no-op when they are already); False if
        llama.cpp refused."""
        if wanted == self.current and ctx is self.ctx:
            return True
        ll = self.ll
        if wanted:
            arr = (ll.llama_adapter_lora_p_ctypes * len(wanted))(
                *(self.handles[i] for i, _ in wanted))
            scales = (ctypes.c_float * len(wanted))(*(s for _, s in wanted))
            rc = ll.llama_set_adapters_lora(ctx, arr, len(wanted), scales)
        else:
            rc = ll.llama_set_adapters_lora(ctx, self._array, 0, None)
        if rc != 0:
            return False
        self.current, self.ctx = wanted, ctx
        return True

    def free(self) -> None:
        for handle in self.handles:
            self.ll.llama_adapter_lora_free(handle)
        self.handles = []
