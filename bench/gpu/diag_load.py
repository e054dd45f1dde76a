"""Which step of vertex-gguf's model load fails on this machine, found by elimination: each
variant runs in its own process (faulthandler on) and adds one of the engine's steps to a plain
llama.cpp load. For a GPU-only crash; run by bench/gpu/run.sh diag (with cuda-gdb's backtrace
of the first variant that dies).

    python bench/gpu/diag_load.py MODEL            # the short diag, then the rest if the engine dies
    python bench/gpu/diag_load.py MODEL VARIANT    # one, in this process
    DIAG_ALL=1 python bench/gpu/diag_load.py MODEL # the rehearsal: what follows, even if all pass
    DIAG_FOREIGN=LIB ...                           # LIB (a foreign libstdc++) loaded before the engine

First, the short diag (a minute on a GPU): the engine with the C++ runtime pinned (what the server
does: app.base.cxx_runtime) and without it (``engine-unpinned``), each printing, at the moment it
calls llama_model_load_from_file, every mapped object that exports std::locale or a locale facet
id (a second C++ runtime the linker shares ids with); then the linker's bindings of those ids
from any file in the unpinned run: ``libstdc++.so.6 -> X ...collate...id`` names the copy X that
numbered them first. The CPU rehearsal makes such an X itself (tests/support/foreign_cxx.py,
DIAG_FOREIGN): the unpinned engine fails, the pinned one loads, and the binding names it.

Where the pinned engine dies, everything else runs, so that one device call both narrows the
cause and finds a way round it:
- the engine with llama.cpp's library loaded before anything else (engine-llamafirst), and with
  libstdc++ or libllama preloaded into the process's global scope (engine@stdcxx, engine@llama:
  LD_PRELOAD). The first of those that passes is printed as ``workaround: LD_PRELOAD=...``,
  which run.sh then applies to the benchmark and the end-to-end stages.
- the dynamic linker's bindings of C++ standard library symbols (LD_DEBUG=bindings) in a plain
  load and in the engine's, side by side: a symbol of libllama's bound to another library in one
  and not the other (two copies of a libstdc++ template or facet) is the usual reason a
  std::regex compile jumps into foreign code, which is what cuda-gdb showed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import subprocess
import sys
import threading
import time

# each a third-party module the engine's process imports, then a plain load (imports-NAME)
IMPORTS = ["greenlet", "gevent", "numpy", "google.cloud.storage", "flask", "pydantic_settings", "jinja2",
           "PIL.Image", "prometheus_client", "redis"]
SHORT = ["engine", "engine-unpinned", "plain"]
VARIANTS = ["thread", "log", "probe", "imports", *(f"imports-{m}" for m in IMPORTS),
            "model", "engine-noprobe", "engine-nolog",
            "engine-nocb", "engine-bigstack", "engine-probe-after", "engine-llamafirst", "gevent",
            "server"]
# the engine with a library preloaded (LD_PRELOAD): ways round a crash, tried only if it dies
PRELOADS = ["stdcxx", "llama"]


def without(step: str) -> None:
    """The engine with one of its load steps taken out (engine-STEP), to find the one that
    makes llama.cpp crash where a plain load does not."""
    from app.engine import cuda_check, llama_engine, llama_log

    if step == "noprobe":  # no ctypes calls into NVML, the runtime and the driver
        cuda_check.probe = lambda info, libs=None: cuda_check.CudaReport()
    elif step == "nolog":  # llama.cpp's own log sink
        llama_log.install = lambda ll, verbose: None
    elif step == "nocb":  # no progress callback: a NULL function pointer
        from llama_cpp import llama_cpp as ll

        null = ll.llama_progress_callback()
        ll.llama_progress_callback = lambda fn: null
    elif step == "bigstack":  # the engine thread on a 256 MiB stack
        from app.base import bridge

        llama_engine.start_native_thread = (
            lambda target, stack_size=0: bridge.start_native_thread(target, stack_size or 256 << 20))
    elif step == "probe-after":  # the probe in the main thread first, as the passing variant did
        from llama_cpp import llama_cpp as ll

        print(cuda_check.probe(ll.llama_print_system_info().decode()).line(), flush=True)


def plain(path: str) -> None:
    from llama_cpp import llama_cpp as ll

    ll.llama_backend_init()
    p = ll.llama_model_default_params()
    p.n_gpu_layers = int(os.environ.get("GPU_LAYERS", "999"))
    model = ll.llama_model_load_from_file(path.encode(), p)
    assert model, "load returned NULL"
    c = ll.llama_context_default_params()
    c.n_ctx = 512
    ctx = ll.llama_init_from_model(model, c)
    assert ctx, "context returned NULL"
    tokens = (ll.llama_token * 4)(1, 2, 3, 4)
    assert ll.llama_decode(ctx, ll.llama_batch_get_one(tokens, 4)) == 0
    ll.llama_free(ctx)
    ll.llama_model_free(model)


def in_thread(fn, path: str) -> None:
    err: list[BaseException] = []

    def run() -> None:
        try:
            fn(path)
        except BaseException as exc:  # noqa: BLE001
            err.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if err:
        raise err[0]


def engine(path: str) -> None:
    os.environ.update(MODEL=path, PARALLEL="4", CTX_SIZE="512")
    os.environ.setdefault("GPU_LAYERS", "999")
    from app import engine_config
    from app.base import cxx_runtime
    from app.base.state import LoadState
    from app.engine.llama_engine import LlamaEngine
    from app.model import source
    from app.settings import Settings

    print(cxx_runtime.runtime().line(), flush=True)
    if os.environ.get("DIAG_FOREIGN"):  # the rehearsal's second runtime, after the app's imports
        import ctypes

        ctypes.CDLL(os.environ["DIAG_FOREIGN"])
    watch_load()
    settings = Settings()
    state = LoadState()
    e = LlamaEngine(engine_config(settings), state, lambda s: source.resolve(settings, s))
    e.start()
    for _ in range(1200):
        if state.stage in ("ready", "failed"):
            break
        time.sleep(0.05)
    assert state.stage == "ready", f"engine stage {state.stage}"


def watch_load() -> None:
    """At the engine's call of llama_model_load_from_file, in the engine's own import order:
    print every mapped object that exports the C++ runtime's locale."""
    from app.engine import llama_model

    load = llama_model.LlamaModel.load

    def watched(self, *args, **kwargs):
        ll = self.ll
        real = ll.llama_model_load_from_file

        def first(*a):
            ll.llama_model_load_from_file = real
            for line in locale_exporters():
                print(line, flush=True)
            return real(*a)

        ll.llama_model_load_from_file = first
        return load(self, *args, **kwargs)

    llama_model.LlamaModel.load = watched


def locale_exporters() -> list[str]:
    """One line per mapped ELF file whose dynamic table defines std::locale's members or the
    locale facet ids (GNU-unique ``u`` symbols ending in 2idE): each is a C++ runtime the
    process's facet numbering is shared with. One is libstdc++.so.6; a second is the suspect."""
    seen: set[str] = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                seen.add(parts[5].strip())
    out = []
    for name in sorted(seen):
        try:
            with open(name, "rb") as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
        except OSError:
            continue
        r = subprocess.run(["nm", "-D", "--defined-only", name], capture_output=True, text=True)
        rows = [ln.split("@")[0].split() for ln in r.stdout.splitlines()]  # no @@GLIBCXX_x
        locale = sum(1 for x in rows if len(x) == 3 and x[2].startswith("_ZNSt6locale"))
        ids = sum(1 for x in rows if len(x) == 3 and x[1] == "u" and x[2].startswith("_ZNSt")
                  and x[2].endswith("2idE"))
        unique = sum(1 for x in rows if len(x) == 3 and x[1] == "u")
        if locale or ids:
            out.append(f"   mapped at load: {name}: {locale} std::locale symbols, {ids} facet "
                       f"ids ({unique} unique symbols) exported")
    return out or ["   mapped at load: no object exports std::locale or a facet id"]


def server(path: str) -> None:
    """The real server (gunicorn, its worker, the crash guard) with llama.cpp's whole log,
    whose end bench/common.process prints if the server dies."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from common import ROOT, process

    env = {"MODEL": path, "PARALLEL": "4", "CTX_SIZE": "512", "LOG_LEVEL": "debug",
           "GPU_LAYERS": os.environ.get("GPU_LAYERS", "999")}
    cmd = [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", "{port}"]
    with process(cmd, env, "/health", "vertex-gguf", 60, cwd=ROOT):
        pass  # ready: the model loaded


def model(path: str) -> None:
    os.environ.update(MODEL=path, PARALLEL="4", CTX_SIZE="512")
    os.environ.setdefault("GPU_LAYERS", "999")
    from llama_cpp import llama_cpp as ll

    from app import engine_config
    from app.engine.llama_embed import DecodeTurns
    from app.engine.llama_model import LlamaModel
    from app.settings import Settings

    m = LlamaModel(ll, engine_config(Settings()), lambda *a, **k: None)
    m.load(path, DecodeTurns(), lambda job: None)
    m.free()


def main() -> None:
    faulthandler.enable()
    path = sys.argv[1]
    if len(sys.argv) > 2:
        v = sys.argv[2]
        if v == "plain":
            plain(path)
        elif v == "thread":
            in_thread(plain, path)
        elif v == "log":
            from llama_cpp import llama_cpp as ll

            from app.engine import llama_log

            llama_log.install(ll, False)
            in_thread(plain, path)
        elif v == "probe":
            from llama_cpp import llama_cpp as ll

            from app.engine import cuda_check

            print(cuda_check.probe(ll.llama_print_system_info().decode()).line(), flush=True)
            in_thread(plain, path)
        elif v == "imports":  # every module the engine imports, then a plain load
            import app.engine.llama_engine  # noqa: F401
            import app.engine.llama_model  # noqa: F401

            in_thread(plain, path)
        elif v.startswith("imports-"):  # one module's import side effects, then a plain load
            import importlib

            importlib.import_module(v.split("-", 1)[1])
            in_thread(plain, path)
        elif v == "model":  # the engine's LlamaModel.load, without LlamaEngine around it
            in_thread(model, path)
        elif v == "engine":
            engine(path)
        elif v == "engine-llamafirst":  # libllama loaded before numpy, greenlet and the rest
            from llama_cpp import llama_cpp  # noqa: F401

            engine(path)
        elif v == "engine-unpinned":  # the engine without app.base.cxx_runtime.pin()
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
            from tests.support.foreign_cxx import unpin

            unpin()
            engine(path)
        elif v.startswith("engine-"):
            without(v.split("-", 1)[1])
            engine(path)
        elif v == "server":
            server(path)
        elif v == "gevent":
            from gevent import monkey

            monkey.patch_all()
            engine(path)
        print(f"{v}: ok", flush=True)
        return
    results = {v: run_variant(path, v) for v in SHORT}
    facet_bindings(path, "engine")
    facet_bindings(path, "engine-unpinned")
    if results.get("engine") == 0 and not os.environ.get("DIAG_ALL"):  # DIAG_ALL: a rehearsal
        return
    results.update({v: run_variant(path, v) for v in VARIANTS})
    for name in PRELOADS:  # the engine died: is there a way round it?
        lib = preload_path(name)
        if lib and run_variant(path, f"engine@{name}", {"LD_PRELOAD": lib}) == 0:
            print(f"workaround: LD_PRELOAD={lib}", flush=True)
            break
    if results.get("plain") == 0:
        compare_bindings(path)


def run_variant(path: str, v: str, env: dict[str, str] | None = None) -> int | None:
    """One variant in its own process (VARIANT@NAME: VARIANT with ``env``); its exit status,
    None if it timed out. Prints the status and the output's tail."""
    real = v.split("@", 1)[0]
    try:
        r = subprocess.run([sys.executable, __file__, path, real], capture_output=True, text=True,
                           timeout=45, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        print(f"== {v}: timed out", flush=True)
        return None
    keep = 60 if v == "server" else 12
    lines = [ln for ln in (r.stdout + r.stderr).strip().splitlines() if "input tensor" not in ln]
    # what the engine said of its C++ runtimes, however long the tail after it
    said = [ln for ln in lines[:-keep] if ln.lstrip().startswith(("C++ runtime:", "mapped at load:"))]
    print(f"== {v}: rc {r.returncode}", *("   " + line for line in said + lines[-keep:]),
          sep="\n", flush=True)
    return r.returncode


def preload_path(name: str) -> str | None:
    """The file LD_PRELOAD names for PRELOADS' ``name``, found without loading it here."""
    if name == "stdcxx":
        import ctypes.util

        return ctypes.util.find_library("stdc++")  # a soname the loader finds on its own
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = os.path.join(spec.submodule_search_locations[0], "lib", "libllama.so")
    return os.path.realpath(lib) if os.path.exists(lib) else None


# C++ standard library symbols as the linker prints them: std::, its vtables, typeinfo, guards
_STD = ("_ZNSt", "_ZNKSt", "_ZSt", "_ZTVSt", "_ZTISt", "_ZTSSt", "_ZNSs", "_ZNKSs", "_ZNSi",
        "_ZNSo", "_ZGVNSt", "_ZTVN9__gnu_cxx", "_ZNSt7__cxx11", "_ZNKSt7__cxx11")


def facet_bindings(path: str, variant: str) -> None:
    """The bindings of the locale's facet ids and std::locale's members, from any file, in one
    run of ``variant``: any not bound to libstdc++ name the second runtime (libstdc++.so.6 ->
    X ...collate...id: X numbered the ids libstdc++'s own locale uses)."""
    b = bindings(path, variant)
    ids = {k: v for k, v in b.items()
           if k[1].startswith("_ZNSt6locale") or (k[1].startswith("_ZNSt") and k[1].endswith("2idE"))}
    away: dict[tuple[str, str], list[str]] = {}
    for (src, sym), dst in ids.items():
        if not dst.startswith("libstdc++"):
            away.setdefault((src, dst), []).append(sym)
    print(f"== facet bindings ({variant}): {len(ids)} bindings of std::locale and facet ids, "
          f"{sum(map(len, away.values()))} to a file other than libstdc++", flush=True)
    for (src, dst), syms in sorted(away.items(), key=lambda kv: -len(kv[1]))[:12]:
        print(f"   {src} -> {dst}: {len(syms)}, e.g. {sorted(syms)[0]}", flush=True)


def bindings(path: str, variant: str) -> dict[tuple[str, str], str]:
    """Which library each C++ standard library symbol was bound to, per (library, symbol), in
    one run of ``variant`` (LD_DEBUG=bindings; a crash still leaves what was bound before it)."""
    import glob
    import re
    import tempfile

    line = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \S+ symbol `([^']+)'")
    out: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": f"{tmp}/ld"}
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run([sys.executable, __file__, path, variant], capture_output=True,
                           timeout=45, env=env)
        for name in glob.glob(f"{tmp}/ld.*"):
            with open(name, errors="replace") as fh:
                for text in fh:
                    m = line.search(text)
                    if m and m.group(3).startswith(_STD):
                        src, dst = (os.path.basename(x) for x in m.group(1, 2))
                        out[(src, m.group(3))] = dst
    return out


def compare_bindings(path: str) -> None:
    """Print the standard library symbols that llama.cpp's libraries bound to different files
    in the engine's run than in a plain load's, and every one bound in the engine's run to a
    file that is neither libstdc++ nor the library itself."""
    plain_b, engine_b = bindings(path, "plain"), bindings(path, "engine")
    llama = ("libllama", "libggml", "libmtmd")
    moved = sorted((k, plain_b[k], v) for k, v in engine_b.items()
                   if k[0].startswith(llama) and k in plain_b and plain_b[k] != v)
    print(f"== bindings: {len(plain_b)} std symbols bound in plain, {len(engine_b)} in engine; "
          f"{len(moved)} bound elsewhere in engine", flush=True)
    for (src, sym), was, now in moved[:40]:
        print(f"   {src}: {sym}: {was} (plain) -> {now} (engine)", flush=True)
    foreign: dict[tuple[str, str], list[str]] = {}
    for (src, sym), dst in engine_b.items():
        if src.startswith(llama) and not dst.startswith(("libstdc++", src.split(".so")[0])):
            foreign.setdefault((src, dst), []).append(sym)
    for (src, dst), syms in sorted(foreign.items(), key=lambda kv: -len(kv[1]))[:12]:
        print(f"   engine: {src} -> {dst}: {len(syms)} std symbols, e.g. {syms[0]}", flush=True)


if __name__ == "__main__":
    main()
