"""llama.cpp's own log lines, through Python logging.

With LOG_LEVEL=debug every line goes through (llama.cpp's verbose output). Otherwise only the
lines that say where the model went: how many layers were offloaded, and each device's model,
KV-cache and compute buffers. On a multi-GPU machine that is how an operator sees the split
(SPLIT_MODE, TENSOR_SPLIT) actually placed; on a CPU it says the model is in host memory.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("vertex_gguf.llama")

# llama.cpp's lines about placement (load_tensors, llama_kv_cache, llama_context, device use)
PLACEMENT = re.compile(
    r"offloaded \d+/\d+ layers|offloading|buffer size|using device|KV self size",
    re.IGNORECASE,
)
# ... and the lines whose numbers the load reports (/props): the KV cache's size, and each
# tensor an override moved (a debug line, read whatever the log level)
_KV_SIZE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB")
_OVERRIDDEN = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")
# each buffer llama.cpp allocates: "CPU_Mapped model buffer size = 92.10 MiB", "CUDA0 KV buffer
# size", "CPU compute buffer size", "CUDA_Host output buffer size", a recurrent "RS buffer size"
_BUFFER = re.compile(r"^\S+:\s+(\S+)\s+(model|KV|RS|output|compute) buffer size =\s*([\d.]+) MiB")
_KINDS = {"model": "weights", "KV": "kv_cache", "RS": "kv_cache", "output": "output",
          "compute": "compute"}
_callback = None  # the ctypes callback, kept alive for as long as llama.cpp may call it


class Seen:
    """What the log said during one load: the KV cache's MiB (of the last context made), the
    tensors moved by overrides, by buffer type, and the bytes of every buffer llama.cpp
    allocated (all contexts), by buffer type and kind (/props "memory": "reported")."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.kv_cache_mib = 0.0
        self.overridden: dict[str, list[str]] = {}
        self.buffers: dict[str, dict[str, int]] = {}

    def read(self, line: str) -> None:
        if m := _KV_SIZE.search(line):
            self.kv_cache_mib = float(m.group(1))
        elif m := _OVERRIDDEN.search(line):
            self.overridden.setdefault(m.group(2), []).append(m.group(1))
        if (m := _BUFFER.search(line)) and not line.startswith("~"):
            by = self.buffers.setdefault(m.group(1), {})
            kind = _KINDS[m.group(2)]
            by[kind] = by.get(kind, 0) + round(float(m.group(3)) * 2**20)


seen = Seen()


def install(ll, verbose: bool) -> None:
    """Route llama.cpp's log through ``log`` (all of it when ``verbose``)."""
    global _callback
    last = [logging.INFO]

    @ll.llama_log_callback
    def forward(level: int, text: bytes, _user: object) -> None:
        # ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continues the previous line
        pylevel = last[0] if level == 5 else {1: logging.DEBUG, 3: logging.WARNING,
                                              4: logging.ERROR}.get(level, logging.INFO)
        last[0] = pylevel
        line = text.decode("utf-8", "replace").rstrip()
        if not line:
            return
        seen.read(line)
        if verbose or pylevel >= logging.ERROR:
            log.log(pylevel, "%s", line)
        elif PLACEMENT.search(line) and not line.startswith("~"):  # not the teardown's
            log.info("placement: %s", line.strip())

    seen.reset()  # a new load
    _callback = forward
    ll.llama_log_set(forward, None)
