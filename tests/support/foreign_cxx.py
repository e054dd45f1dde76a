"""A second C++ runtime in the process, made on purpose (app.base.cxx_runtime; docs/crashes.md).

``build`` compiles a small shared library linked with ``-static-libstdc++``: its copy of
libstdc++ exports the locale facet ids (GNU-unique symbols the dynamic linker shares across the
process), and its static initialiser writes a number into an ``ostringstream``, so loading it
builds that copy's classic locale and numbers the ids, as the foreign runtime on the GPU did.
``hidden=True`` links it with ``-Wl,--exclude-libs,ALL``: the copy is there but exports nothing.

``unpin`` makes ``app.base.cxx_runtime.pin()`` a no-op in a fresh interpreter, before ``app`` is
imported: the process without the fix, so a test can show the fix is what makes it pass.

``python -m tests.support.foreign_cxx pinned|unpinned FOREIGN|- MODEL`` is that process: the
app imported, the foreign library loaded, the model loaded by the real engine; it prints what
the load came to as one JSON line. Used by tests/e2e/test_cxx_runtime.py and, for its rehearsal
on the CPU, bench/gpu/diag_load.py.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SOURCE = r"""
#include <sstream>
#include <string>

namespace {
struct Init {
  Init() {
    std::ostringstream out;  // builds this copy's classic locale: every facet id numbered
    out << 42;
    length = out.str().size();
  }
  std::size_t length = 0;
} init;
}  // namespace

extern "C" int foreign_cxx_length() { return static_cast<int>(init.length); }
"""

FACET_ID = "_ZNSt7__cxx117collateIcE2idE"  # std::__cxx11::collate<char>::id, GNU-unique


def compiler() -> str | None:
    return shutil.which("g++")


def build(out_dir: Path, hidden: bool = False) -> Path:
    """The foreign library (raises CalledProcessError with g++'s output if it fails)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "foreign_cxx.cpp"
    src.write_text(SOURCE)
    lib = out_dir / ("libforeign_hidden.so" if hidden else "libforeign.so")
    cmd = [compiler() or "g++", "-shared", "-fPIC", "-O1", "-static-libstdc++", str(src),
           "-o", str(lib)]
    if hidden:
        cmd.insert(-3, "-Wl,--exclude-libs,ALL")
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return lib


def exported_unique(lib: Path) -> set[str]:
    """The GNU-unique symbols ``lib`` exports in its dynamic table (``nm -D``: type ``u``)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {parts[2] for parts in (line.split("@")[0].split() for line in out.splitlines())
            if len(parts) == 3 and parts[1] == "u"}


def unpin() -> None:
    """Before ``app`` is imported: load app.base.cxx_runtime from its file with ``pin`` made a
    no-op, so ``app/__init__`` (and the engine) find this one and pin nothing."""
    name = "app.base.cxx_runtime"
    if name in sys.modules:
        raise RuntimeError("unpin() must run before app is imported")
    spec = importlib.util.spec_from_file_location(name, ROOT / "app" / "base" / "cxx_runtime.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    module.pin = module.runtime  # what pin() would return without having pinned


def load(mode: str, foreign: str, model: str) -> dict:
    """In a fresh interpreter: the app imported as a server imports it (``unpin`` first when
    ``mode`` is "unpinned"), the foreign library loaded RTLD_LOCAL as a CUDA library would be,
    then the model loaded by the real engine. What the engine's load came to."""
    import ctypes
    import os
    import time

    if mode == "unpinned":
        unpin()
    import app  # noqa: F401  (gevent, greenlet and the rest, as in a server's process)
    from app import engine_config
    from app.base import cxx_runtime
    from app.base.state import LoadState
    from app.engine.llama_engine import LlamaEngine
    from app.model import source
    from app.settings import Settings

    if foreign != "-":
        ctypes.CDLL(foreign)
    os.environ.update(MODEL=model, PARALLEL="1", CTX_SIZE="512")
    settings = Settings()
    state = LoadState()
    engine = LlamaEngine(engine_config(settings), state, lambda s: source.resolve(settings, s))
    engine.start()
    for _ in range(1200):  # at most a minute
        if state.stage in ("ready", "failed"):
            break
        time.sleep(0.05)
    return {"stage": state.stage, "error": state.error, "pinned": cxx_runtime.runtime().pinned,
            "global": cxx_runtime.is_global()}


if __name__ == "__main__":
    import json
    import logging
    import os

    logging.basicConfig(level=logging.WARNING)  # llama.cpp's error lines, on stderr
    print(json.dumps(load(*sys.argv[1:4])), flush=True)
    os._exit(0)  # the engine thread holds the model: no teardown to wait for
