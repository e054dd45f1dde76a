"""Which step of vertex-gguf's model load fails on this machine, found by elimination: each
variant runs in its own process (faulthandler on) and adds one of the engine's steps to a plain
llama.cpp load. For a GPU-only crash; run by bench/gpu/run.sh diag (with cuda-gdb's backtrace
of the first variant that dies).

    python bench/gpu/diag_load.py MODEL            # every variant, one line each
    python bench/gpu/diag_load.py MODEL VARIANT    # one, in this process
"""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
import threading
import time

# each a third-party module the engine's process imports, then a plain load (imports-NAME)
IMPORTS = ["gevent", "numpy", "google.cloud.storage", "flask", "pydantic_settings", "jinja2",
           "PIL.Image", "prometheus_client", "redis"]
VARIANTS = ["plain", "thread", "log", "probe", "imports", *(f"imports-{m}" for m in IMPORTS),
            "model", "engine", "engine-noprobe", "engine-nolog",
            "engine-nocb", "engine-bigstack", "engine-probe-after", "gevent", "server"]


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
    from app.base.state import LoadState
    from app.engine.llama_engine import LlamaEngine
    from app.model import source
    from app.settings import Settings

    settings = Settings()
    state = LoadState()
    e = LlamaEngine(engine_config(settings), state, lambda s: source.resolve(settings, s))
    e.start()
    for _ in range(1200):
        if state.stage in ("ready", "failed"):
            break
        time.sleep(0.05)
    assert state.stage == "ready", f"engine stage {state.stage}"


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
    for v in VARIANTS:
        try:
            r = subprocess.run([sys.executable, __file__, path, v], capture_output=True, text=True,
                               timeout=45)
            keep = 60 if v == "server" else 12
            tail = [ln for ln in (r.stdout + r.stderr).strip().splitlines() if "input tensor" not in ln][-keep:]
            print(f"== {v}: rc {r.returncode}", *("   " + line for line in tail), sep="\n", flush=True)
        except subprocess.TimeoutExpired:
            print(f"== {v}: timed out", flush=True)


if __name__ == "__main__":
    main()
