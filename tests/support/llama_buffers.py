"""What llama.cpp itself allocates for a model and its contexts, read from its own log lines
("CPU_Mapped model buffer size = 92.10 MiB", "CPU KV buffer size", "compute buffer size",
"output buffer size", a recurrent model's "RS buffer size"), for the memory estimate's tests.

Runs in a child process (one llama.cpp per process, its log callback its own):

    python -m tests.support.llama_buffers MODEL.gguf '{"model": {...}, "contexts": [{...}]}'

``model`` sets llama_model_params fields (n_gpu_layers, use_extra_bufts); each of
``contexts`` sets llama_context_params fields (n_ctx, n_seq_max, n_batch, n_ubatch, type_k,
type_v, flash_attn_type, kv_unified, swa_full, embeddings, pooling_type). The context is made,
measured and freed before the next. It prints one JSON line: the model's buffers by buffer type,
then each context's (bytes; llama.cpp prints MiB to two decimals, so each figure is within
5 KiB), and ``n_ctx_seq``. ``measure`` runs it from a test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BUFFER = re.compile(r"(\S+)\s+(model|KV|RS|output|compute) buffer size =\s*([\d.]+) MiB")


def parse(lines: list[str]) -> dict[str, dict[str, int]]:
    """The buffer lines among ``lines``: kind -> buffer type -> bytes (summed, as an SWA
    model's two caches each print one)."""
    out: dict[str, dict[str, int]] = {}
    for line in lines:
        if m := _BUFFER.search(line):
            kind = {"model": "weights", "KV": "kv", "RS": "kv"}.get(m.group(2), m.group(2))
            by = out.setdefault(kind, {})
            by[m.group(1)] = by.get(m.group(1), 0) + round(float(m.group(3)) * 2**20)
    return out


def measure(model: Path, spec: dict, timeout: float = 300) -> dict:
    r = subprocess.run([sys.executable, "-m", "tests.support.llama_buffers", str(model),
                        json.dumps(spec)], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        raise RuntimeError(f"llama_buffers failed ({r.returncode}): {r.stderr[-3000:]}")
    return json.loads(lines[-1])


def _main(path: str, spec: dict) -> dict:
    from app.base import cxx_runtime

    cxx_runtime.pin()
    from llama_cpp import llama_cpp as ll

    lines: list[str] = []

    @ll.llama_log_callback
    def log(_level: int, text: bytes, _user: object) -> None:
        lines.append(text.decode("utf-8", "replace"))

    ll.llama_log_set(log, None)
    ll.llama_backend_init()
    mp = ll.llama_model_default_params()
    for k, v in spec.get("model", {}).items():
        setattr(mp, k, v)
    model = ll.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise SystemExit("the model did not load:\n" + "".join(lines[-20:]))
    out: dict = {"model": parse("".join(lines).splitlines()).get("weights", {}),
                 "contexts": []}
    for cspec in spec.get("contexts", []):
        lines.clear()
        cp = ll.llama_context_default_params()
        for k, v in cspec.items():
            setattr(cp, k, v)
        ctx = ll.llama_init_from_model(model, cp)
        if not ctx:
            out["contexts"].append({"error": "".join(lines[-10:])})
            continue
        got = parse("".join(lines).splitlines())
        got["n_ctx_seq"] = ll.llama_n_ctx_seq(ctx)
        got["n_ctx"] = ll.llama_n_ctx(ctx)
        out["contexts"].append(got)
        ll.llama_free(ctx)
    ll.llama_model_free(model)
    return out


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1], json.loads(sys.argv[2]))))
