"""How generation and embeddings share the machine: taking turns at llama_decode vs not.

The engine runs embeddings in a second llama.cpp context on a thread of its own; by default the
two threads alternate at ``llama_decode`` (app.engine.llama_embed.DecodeTurns). This measures,
in one process and one run, on the engine directly (no HTTP):

- a generation's tokens/s alone, and while embedding requests arrive back to back;
- an embedding request's latency alone, and while that generation runs;

once with turns and once with both threads decoding freely (turns replaced by no-ops), so the
choice is a measured one. Not a test: the figures depend on the machine.

    python bench/embed_turns.py [--model PATH] [--inputs 16] [--tokens 400]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gevent  # noqa: E402

from app import engine_config  # noqa: E402
from app.base.state import LoadState  # noqa: E402
from app.engine import llama_embed  # noqa: E402
from app.engine.embed import EmbedRequest  # noqa: E402
from app.engine.llama_engine import LlamaEngine  # noqa: E402
from app.engine.types import Finished, GenerationRequest, SamplingParams  # noqa: E402
from app.settings import Settings  # noqa: E402

DEFAULT_MODEL = "/tmp/vertex-gguf/default/SmolLM2-135M-Instruct.Q4_1.gguf"


def start(model: str) -> LlamaEngine:
    s = Settings(model=model, threads=2, parallel=2, embeddings="on", embedding_ctx=2048)
    engine = LlamaEngine(engine_config(s), LoadState(), lambda _: model)
    engine.start()
    for _ in range(3000):  # bounded: 300 s
        if engine.state.ready or engine.state.stage == "failed":
            break
        time.sleep(0.1)
    assert engine.state.ready, engine.state.snapshot()
    return engine


def embed_once(engine: LlamaEngine, texts: tuple[str, ...]) -> float:
    t = time.perf_counter()
    engine.embedder.submit(EmbedRequest(texts)).result(120)
    return time.perf_counter() - t


def generate(engine: LlamaEngine, tokens: int, texts: tuple[str, ...] | None = None
             ) -> tuple[float, list[float]]:
    """tokens/s of one greedy generation of ``tokens`` tokens; with ``texts``, embedding
    requests of them are sent back to back (from another greenlet) while it runs, and their
    latencies returned."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    handle = engine.submit(GenerationRequest("Count from one to a thousand:", params))
    handle.next_event(60)  # accepted
    done = False
    lat: list[float] = []

    def embed_loop() -> None:
        for _ in range(10_000):  # bounded; ends with the generation
            if done:
                return
            lat.append(embed_once(engine, texts))

    pump = gevent.spawn(embed_loop) if texts else None
    t = time.perf_counter()
    n = 0
    for _ in range(tokens * 4 + 100):  # bounded
        ev = handle.next_event(120)
        if isinstance(ev, Finished):
            n = ev.completion_tokens
            break
    rate = n / (time.perf_counter() - t)
    done = True
    if pump is not None:
        pump.join(120)
    return rate, lat


def run(engine: LlamaEngine, inputs: int, tokens: int) -> dict[str, float]:
    texts = tuple(f"A short sentence to embed, number {i}." for i in range(inputs))
    embed_once(engine, texts)  # warm
    alone = statistics.median(embed_once(engine, texts) for _ in range(5))
    gen_alone, _ = generate(engine, tokens)
    gen_busy, lat = generate(engine, tokens, texts)
    return {"embed_ms": alone * 1000, "embed_busy_ms": statistics.median(lat) * 1000,
            "embeds": len(lat), "gen_tps": gen_alone, "gen_busy_tps": gen_busy}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--inputs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=400)
    args = ap.parse_args()
    rows = {}
    engine = start(args.model)
    try:
        rows["turns (default)"] = run(engine, args.inputs, args.tokens)
        free = contextlib.nullcontext
        engine._turns.host = lambda: free()  # type: ignore[method-assign]
        engine.embedder._turns = llama_embed.DecodeTurns()
        engine.embedder._turns.guest = lambda: free()  # type: ignore[method-assign]
        rows["free-running"] = run(engine, args.inputs, args.tokens)
    finally:
        engine.shutdown()
    print(f"| sharing | embed {args.inputs} alone ms | embed {args.inputs} during generation ms "
          "| generation tok/s alone | generation tok/s with embeddings | embeds during |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['embed_ms']:.0f} | {r['embed_busy_ms']:.0f} | {r['gen_tps']:.1f} "
              f"| {r['gen_busy_tps']:.1f} | {r['embeds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
