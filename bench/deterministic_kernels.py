"""Which batch shapes change a sequence's numbers in llama.cpp (the measurements behind
DETERMINISTIC's design, app/engine/deterministic.py): the logits of one sequence, bit for bit,
decoded in different company, through the pinned bindings directly (no server).

A 300-token prompt of random ids, then 24 steps feeding the same fixed tokens, compared with
the sequence decoded alone in one piece. ``shapes`` varies one thing at a time: where the
prompt is cut into decodes, other sequences in the same decodes (their prompts, then their
steps), the micro-batch size, a unified KV buffer. ``canon`` checks the mode's rules: a
second turn (turn 1's prompt, 40 reply tokens decoded one per step, then 30 more) decoded from
nothing against the same turn over turn 1's cells cut back to a multiple of the chunk, with a
slot that held a longer conversation before, and with another sequence busy; every decode one
sequence, prompts cut at multiples of 256.

    PYTHONPATH=. python bench/deterministic_kernels.py shapes|canon MODEL.gguf \\
        [--flash-attn 0|1] [--threads 2] [--extra-buffers 0|1]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

CHUNK = 256
P = 300


class Ctx:
    """A context on the model: decode rows, read logits."""

    def __init__(self, L, model, args, n_seq: int, ub: int = 512, unified: bool = False):
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 2048 * n_seq, 4096, ub, n_seq
        cp.n_threads = cp.n_threads_batch = args.threads
        cp.flash_attn_type, cp.kv_unified = args.flash_attn, unified
        self.L, self.ctx = L, L.llama_init_from_model(model, cp)
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(4096, 0, 1)
        self.nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

    def decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        b.n_tokens = len(rows)
        for i, (tok, pos, seq, out) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, out
            b.seq_id[i][0] = seq
        assert self.L.llama_decode(self.ctx, b) == 0

    def logits(self, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, i), (self.nv,)).copy()

    def free(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)


def shapes(L, model, args, rng) -> None:
    nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    prompt = rng.integers(100, nv - 100, P).tolist()
    other = [rng.integers(100, nv - 100, 1200).tolist() for _ in range(7)]
    forced = rng.integers(100, nv - 100, 25).tolist()

    def run(chunks=(P,), others=0, olen=300, together=False, ub=512, unified=False):
        c = Ctx(L, model, args, 8, ub, unified)
        if others and not together:
            c.decode([(t, j, s + 1, False) for s in range(others)
                      for j, t in enumerate(other[s][:olen])])
        pos = 0
        for k, n in enumerate(chunks):
            rows = [(t, pos + j, 0, pos + j == P - 1) for j, t in enumerate(prompt[pos:pos + n])]
            if k == 0 and others and together:
                rows += [(t, j, s + 1, False) for s in range(others)
                         for j, t in enumerate(other[s][:olen])]
            c.decode(rows)
            pos += n
        out = [c.logits(chunks[-1] - 1)]
        for k in range(24):
            rows = [(forced[k], P + k, 0, True)]
            if others and not together:
                rows += [(1, olen + k, s + 1, True) for s in range(others)]
            c.decode(rows)
            out.append(c.logits(0))
        c.free()
        return out

    base = run()
    cases = {"again": {}, "prompt cut 256+44": {"chunks": (256, 44)},
             "prompt cut 296+4": {"chunks": (296, 4)},
             "prompt cut in 64s": {"chunks": (64, 64, 64, 64, 44)},
             "1 other: steps together": {"others": 1},
             "3 others: steps together": {"others": 3},
             "7 others: steps together": {"others": 7},
             "7 others: prompts together": {"others": 7, "together": True},
             "micro-batch 64": {"ub": 64},
             "unified KV, 7 others": {"others": 7, "unified": True}}
    for name, kw in cases.items():
        got = run(**kw)
        same = [bool(np.array_equal(a, b)) for a, b in zip(base, got, strict=True)]
        print(f"{name:28s} prompt's logits {'same' if same[0] else 'DIFFER'}, "
              f"steps {'same' if all(same[1:]) else 'DIFFER'}")


def canon(L, model, args, rng) -> None:
    nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    prompt = rng.integers(100, nv - 100, P).tolist()
    reply = rng.integers(100, nv - 100, 40).tolist()
    turn2 = prompt + reply + rng.integers(100, nv - 100, 30).tolist()
    forced = rng.integers(100, nv - 100, 24).tolist()

    def prefill(c: Ctx, toks: list[int], start: int, seq: int = 0) -> np.ndarray:
        pos = n = 0
        pos = start
        while pos < len(toks):
            n = min(len(toks) - pos, CHUNK - pos % CHUNK)
            c.decode([(t, pos + j, seq, pos + j == len(toks) - 1)
                      for j, t in enumerate(toks[pos:pos + n])])
            pos += n
        return c.logits(n - 1)

    def steps(c: Ctx, first: np.ndarray) -> list[np.ndarray]:
        out = [first]
        for k, t in enumerate(forced):
            c.decode([(t, len(turn2) + k, 0, True)])
            out.append(c.logits(0))
        return out

    def fresh() -> list[np.ndarray]:
        c = Ctx(L, model, args, 4)
        out = steps(c, prefill(c, turn2, 0))
        c.free()
        return out

    def reused(dirty: bool = False, busy: bool = False) -> list[np.ndarray]:
        c = Ctx(L, model, args, 4)
        if dirty:
            prefill(c, rng.integers(100, nv - 100, 900).tolist(), 0)
            L.llama_memory_seq_rm(c.mem, 0, 0, -1)
        if busy:
            prefill(c, rng.integers(100, nv - 100, 700).tolist(), 0, seq=1)
        prefill(c, prompt, 0)
        for k, t in enumerate(reply):
            c.decode([(t, P + k, 0, True)])
        keep = (min(P + len(reply), len(turn2) - 1) // CHUNK) * CHUNK
        L.llama_memory_seq_rm(c.mem, 0, keep, -1)
        out = steps(c, prefill(c, turn2, keep))
        c.free()
        return out

    base = fresh()
    for name, got in (("from nothing again", fresh()), ("over turn 1's cells", reused()),
                      ("... a slot used before", reused(dirty=True)),
                      ("... another sequence busy", reused(busy=True))):
        same = all(np.array_equal(a, b) for a, b in zip(base, got, strict=True))
        print(f"{name:28s} {'same' if same else 'DIFFER'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("shapes", "canon"))
    ap.add_argument("model")
    ap.add_argument("--flash-attn", type=int, default=1, choices=(0, 1))
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    ap.add_argument("--extra-buffers", type=int, default=1, choices=(0, 1))
    args = ap.parse_args()
    import llama_cpp.llama_cpp as L

    quiet = L.llama_log_callback(lambda *_: None)  # kept alive: llama.cpp calls it
    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = bool(args.extra_buffers)
    model = L.llama_model_load_from_file(args.model.encode(), mp)
    print(f"# {os.path.basename(args.model)} flash_attn={args.flash_attn} "
          f"threads={args.threads} extra_buffers={args.extra_buffers}")
    (shapes if args.what == "shapes" else canon)(L, model, args, np.random.default_rng(0))


if __name__ == "__main__":
    main()
