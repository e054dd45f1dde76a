"""Multi-token prediction (SPEC_MTP): drafts from the model's own NextN layers, no second model.

A model trained with MTP heads (GLM-4.5, DeepSeek V3, Hunyuan v3...) carries after its trunk
one or more NextN layers that, given a token and the trunk's hidden state at the position
before it, predict the token after it. llama.cpp runs them in a second context on the same
model (``LLAMA_CONTEXT_TYPE_MTP``), whose KV cache holds the NextN layer alone.

That context must see every position the target decodes, each row a token with the target's
hidden state of the row before, and those hidden states exist only right after the target's
decode. So every target decode is mirrored (``mirror``: prompt chunks, generation steps,
drafts being checked): its rows, with copies of the hidden states, wait until the head next
drafts (a rejected draft's rows are dropped before they are ever decoded) or fill a batch.
Drafting (``draft``) decodes them, then runs the head n times, each one decode for every asking
sequence, each step fed the head's own hidden state; its cells are dropped after.

The target's KV edits reach here through ``kv.KvShadow`` (a cut, a copy, cells it cannot
follow). A cut at a position whose hidden state is gone (a prompt reusing part of a cached
one) gives that one row a zero state, as position 0 has: its drafts may be kept less often,
never wrong (the target checks every one). A sequence whose cells the head cannot mirror (an
image's embeddings, a prompt restored from the prompt cache) is not drafted for until the
target's sequence starts afresh.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.base.errors import ModelLoadError
from app.engine.llama_embed import open_context
from app.model.gguf_header import GgufError, read_model

log = logging.getLogger(__name__)

# the architectures llama.cpp builds an MTP graph for whose memory can drop a draft's tail
# (the hybrids qwen35, qwen35moe, qwen3next, nemotron_h_moe would need their recurrent state
# rolled back: speculation is off for them)
MTP_ARCHS = ("glm4moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "mimo2", "step35",
             "hy_v3", "cohere2moe", "bailingmoe3")


def nextn_tensor(n_block: int) -> str:
    """The tensor every NextN layer has (its embedding-and-hidden projection); llama.cpp
    aborts the process when a model claims NextN layers without it, so it is looked for in
    the GGUF's header before ``load_mtp``."""
    return f"blk.{n_block - 1}.nextn.eh_proj.weight"


def has_mtp(arch: str, metadata: dict[str, Any], tensors: set[str]) -> tuple[bool, str]:
    """Whether the GGUF (its architecture, metadata, tensor names) carries MTP layers
    llama.cpp can run; and why not, when it does not (for SPEC_MTP=on's error)."""
    n_nextn = metadata.get(f"{arch}.nextn_predict_layers", 0)
    if not isinstance(n_nextn, int) or n_nextn <= 0:
        return False, f"the model ({arch}) has no MTP layers ({arch}.nextn_predict_layers)"
    if arch not in MTP_ARCHS:
        return False, (f"llama.cpp runs no MTP layers of a {arch} model whose memory can drop a "
                       "rejected draft (it does for " + ", ".join(MTP_ARCHS) + ")")
    n_block = metadata.get(f"{arch}.block_count", 0)
    want = nextn_tensor(n_block) if isinstance(n_block, int) and n_block > 0 else "?"
    if want not in tensors:
        return False, (f"the model claims {n_nextn} MTP layer(s) but has no {want} tensor "
                       "(a GGUF converted without them)")
    return True, ""


def wanted(mode: str, path: str, draft: str | None) -> bool:
    """SPEC_MTP resolved for the GGUF at ``path``, from its header (before llama.cpp reads
    it: ``load_mtp`` on a model without the layers' tensors aborts the process). auto: where
    the layers are and no DRAFT_MODEL is set; on: a ModelLoadError saying why not."""
    if mode == "off":
        return False
    if draft is not None:
        if mode == "on":
            raise ModelLoadError("SPEC_MTP=on and DRAFT_MODEL both draft: set one of them")
        return False
    try:
        head = read_model(path)
    except (GgufError, OSError) as err:
        if mode == "on":
            raise ModelLoadError(f"SPEC_MTP=on: the GGUF's header could not be read ({err})") \
                from err
        return False
    arch = head.architecture
    ok, why = has_mtp(arch, head.metadata, {t.name for t in head.tensors})
    if not ok and mode == "on":
        raise ModelLoadError(f"SPEC_MTP=on: {why}")
    if not ok and head.arch("nextn_predict_layers", 0):
        log.warning("multi-token prediction is off: %s", why)
    return ok


@dataclass
class _Seq:
    """What the head's KV holds of one target sequence."""

    n: int = 0  # target positions 0..n-1 mirrored
    h: np.ndarray | None = None  # the target's hidden state at n-1 (None: gone, zeros used)
    lost: bool = False  # cells the head cannot follow: no drafts until the target restarts


class MtpDrafter:
    """The MTP context on the target's model, one sequence per slot, and each sequence's
    mirror state. Errors in its own decodes drop its cells (no drafts until the sequences
    restart); the target goes on."""

    def __init__(self, ll: Any, x: Any, model: Any, target_ctx: Any, n_ctx: int, n_seq: int,
                 n_batch: int, n_ubatch: int, threads: int, flash_attn: int, draft_max: int):
        self.ll, self.x = ll, x  # llama_cpp.llama_cpp and llama_cpp.llama_cpp_ext
        params: dict[str, object] = dict(
            n_ctx=n_ctx * n_seq, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq,
            n_threads=threads, n_threads_batch=threads, flash_attn_type=flash_attn,
            kv_unified=False, ctx_type=ll.LLAMA_CONTEXT_TYPE_MTP, n_rs_seq=0,
            ctx_other=target_ctx)
        if "n_outputs_max" in dict(ll.llama_context_params._fields_):
            params["n_outputs_max"] = n_seq  # a drafting decode reads one row per sequence
        self.ctx, self.mem = open_context(ll, model, "the MTP context", "lower CTX_SIZE or "
                                          "PARALLEL, or set SPEC_MTP=off", **params)
        self.batch = ll.llama_batch_ext_init(self.ctx)
        if not self.batch:
            ll.llama_free(self.ctx)
            raise ModelLoadError("could not create the MTP context's batch")
        x.llama_set_embeddings_nextn(target_ctx, True, False)  # a hidden state per row
        x.llama_set_embeddings_nextn(self.ctx, True, True)
        self.target = target_ctx
        self.width = ll.llama_model_n_embd_out(model)
        self.vocab = ll.llama_model_get_vocab(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_batch = n_batch
        self.draft_max = draft_max
        self.seqs = {i: _Seq() for i in range(n_seq)}
        self._zero = np.zeros(self.width, np.float32)
        # the last target decode's hidden states, by sequence: (first position, rows)
        self._last: dict[int, tuple[int, np.ndarray]] = {}
        self._proposed: dict[int, int] = {}  # seq -> tokens drafted this step
        # mirrored rows not yet decoded into the head: (token, position, seq, hidden state)
        self._pending: list[tuple[int, int, int, np.ndarray]] = []
        self.drafted = 0
        self.accepted = 0

    # ---- following the target ----------------------------------------------------------------
    def mirror(self, batch: Any, n: int) -> None:
        """The target just decoded the first ``n`` rows of ``batch`` (a ``llama_batch``):
        the same rows into the head, each with the target's hidden state of the row before."""
        if n <= 0:
            return
        nth = self.x.llama_get_embeddings_nextn_ith
        hidden = np.empty((n, self.width), np.float32)
        for i in range(n):  # by batch index: llama.cpp maps it to its output row
            ptr = nth(self.target, i)
            if not ptr:
                self._reset()
                return
            hidden[i] = np.ctypeslib.as_array(ptr, shape=(self.width,))
        toks = np.ctypeslib.as_array(batch.token, shape=(n,))
        poss = np.ctypeslib.as_array(batch.pos, shape=(n,))
        rows: list[tuple[int, int, int, np.ndarray]] = []
        first: dict[int, tuple[int, list[int]]] = {}
        for i in range(n):
            seq, pos = int(batch.seq_id[i][0]), int(poss[i])
            st = self.seqs.get(seq)
            if st is None or st.lost:
                continue
            if pos != st.n:  # a gap the head did not see: it cannot follow this sequence
                self.lose(seq)
                continue
            rows.append((int(toks[i]), pos, seq, self._zero if st.h is None else st.h))
            st.n, st.h = pos + 1, hidden[i].copy()  # not a view keeping the decode's rows
            first.setdefault(seq, (pos, []))[1].append(i)
        self._last = {s: (p, hidden[idx]) for s, (p, idx) in first.items()}
        self._pending += rows
        if len(self._pending) >= self.n_batch:
            self._flush()

    def _flush(self) -> bool:
        """The pending rows into the head."""
        rows, self._pending = self._pending, []
        if rows and not self._decode(rows, outputs=()):
            self._reset()
            return False
        return True

    def _unpend(self, seq: int, pos: int = 0) -> None:
        """Forget the pending rows of ``seq`` from position ``pos`` on."""
        self._pending = [r for r in self._pending if r[2] != seq or r[1] < pos]

    def cut(self, seq: int, pos: int) -> None:
        """The target dropped sequence ``seq``'s cells from ``pos`` on (0: all of them)."""
        st = self.seqs.get(seq)
        if st is None:
            return
        self._unpend(seq, max(pos, 0))
        if pos <= 0:
            self.ll.llama_memory_seq_rm(self.mem, seq, -1, -1)
            self.seqs[seq] = _Seq()
            return
        if st.lost or pos >= st.n:
            return
        self.ll.llama_memory_seq_rm(self.mem, seq, pos, -1)
        st.n, st.h = pos, None
        last = self._last.get(seq)
        if last is not None and 0 <= pos - 1 - last[0] < len(last[1]):
            st.h = last[1][pos - 1 - last[0]]  # a checked draft's tail: its state is known

    def copied(self, src: int, dst: int) -> None:
        """The target's sequence ``dst`` became a copy of ``src``."""
        a = self.seqs.get(src)
        if a is None or dst not in self.seqs:
            return
        self._unpend(dst)
        if not self._flush():  # the source's cells whole before they are copied
            return
        a = self.seqs[src]
        self.ll.llama_memory_seq_rm(self.mem, dst, -1, -1)
        if not a.lost:
            self.ll.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        self.seqs[dst] = _Seq(a.n, a.h, a.lost)

    def lose(self, seq: int) -> None:
        """The target's sequence holds cells the head cannot mirror (an image, a restore)."""
        if seq in self.seqs:
            self._unpend(seq)
            self.ll.llama_memory_seq_rm(self.mem, seq, -1, -1)
            self.seqs[seq] = _Seq(lost=True)

    def in_sync(self, seq: int, n_pos: int) -> bool:
        """Whether the head holds every position of the target's sequence (``n_pos`` of them)."""
        st = self.seqs.get(seq)
        return st is not None and not st.lost and st.n == n_pos

    # ---- drafting ----------------------------------------------------------------------------
    def draft(self, asks: list[tuple[int, int, int, int, float]]) -> dict[int, list[int]]:
        """``asks``: (seq id, its last sampled token, that token's position, most to draft,
        least confidence); each sequence in sync. Greedy drafts from the head, every sequence
        one token per decode, stopped below its least confidence (the softmax top
        probability) or at ``draft_max``; the head's drafted cells are dropped after."""
        out: dict[int, list[int]] = {seq: [] for seq, *_ in asks}
        live = [(seq, tok, pos, min(n_max, self.draft_max), p_min,
                 self._zero if self.seqs[seq].h is None else self.seqs[seq].h)
                for seq, tok, pos, n_max, p_min in asks]
        # the pending mirrored rows in a decode of their own: a drafting decode's rows must all
        # be outputs (llama.cpp's masked hidden states are the graph's first n_outputs rows)
        if not self._flush():
            return {}
        while live:
            if not self._decode([(tok, pos, seq, h) for seq, tok, pos, _, _, h in live],
                                outputs=range(len(live))):
                self._reset()
                return {}
            nxt = []
            for i, (seq, _, pos, n_max, p_min, _) in enumerate(live):
                top = self._top(i)
                if top is None:  # llama.cpp returned no logits for the row
                    self._reset()
                    return {}
                tok, p = top
                if p < p_min or self.ll.llama_vocab_is_eog(self.vocab, tok):
                    continue
                out[seq].append(tok)
                if len(out[seq]) < n_max:
                    ptr = self.x.llama_get_embeddings_nextn_ith(self.ctx, i)
                    if not ptr:  # llama.cpp has no state for the row: stop drafting
                        self._reset()
                        return {}
                    h = np.ctypeslib.as_array(ptr, shape=(self.width,)).copy()
                    nxt.append((seq, tok, pos + 1, n_max, p_min, h))
            live = nxt
        for seq, _, pos, *_ in asks:  # the head's own cells past the target's
            self.ll.llama_memory_seq_rm(self.mem, seq, pos, -1)
        self._proposed.update((seq, len(d)) for seq, d in out.items() if d)
        return out

    def verified(self, seq: int, drafted: int, kept: int) -> None:
        """The target checked ``drafted`` tokens of sequence ``seq``'s draft and kept ``kept``:
        counted here when the draft was the head's."""
        if self._proposed.pop(seq, 0):
            self.drafted += drafted
            self.accepted += kept

    def report(self) -> dict[str, int]:
        """For /health and /metrics."""
        return {"draft_tokens": self.drafted, "draft_tokens_accepted": self.accepted,
                "sequences_unfollowed": sum(s.lost for s in self.seqs.values())}

    def reset_stats(self) -> None:
        self.drafted = self.accepted = 0

    # ---- llama.cpp ---------------------------------------------------------------------------
    def _top(self, i: int) -> tuple[int, float] | None:
        ptr = self.ll.llama_get_logits_ith(self.ctx, i)
        if not ptr:
            return None
        row = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        tok = int(np.argmax(row))
        return tok, 1.0 / float(np.exp(row - row[tok]).sum())

    def _decode(self, rows: list[tuple[int, int, int, np.ndarray]], outputs: range | tuple) -> bool:
        """(token, position, sequence, hidden state) rows into the head, in batches of
        ``n_batch``; logits at the row indexes in ``outputs`` (a single batch then)."""
        ll, b = self.ll, self.batch
        for start in range(0, len(rows), self.n_batch):
            part = rows[start:start + self.n_batch]
            ll.llama_batch_ext_clear(b)
            keep = []  # alive until the decode: llama.cpp copies them there
            for k, (tok, pos, seq, h) in enumerate(part):
                i = ll.llama_batch_ext_add_token(b, seq, tok)
                p = (ll.llama_pos * 4)(pos, 0, 0, 0)
                arr = np.ascontiguousarray(h, dtype=np.float32)
                keep += (p, arr)
                emb = ll.llama_embd(arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1,
                                    self.width)
                if i < 0 or not ll.llama_batch_ext_set_pos(b, i, p) \
                        or not ll.llama_batch_ext_set_embd_token(b, i, emb):
                    log.warning("the MTP batch refused a row: its cache is reset")
                    return False
                if start + k in outputs:
                    ll.llama_batch_ext_set_output_logits(b, i, True)
            rc = ll.llama_process(self.ctx, ll.LLAMA_PROCESS_TYPE_DECODE, b)
            if rc != 0:
                log.warning("the MTP context's decode failed (code %d): its cache is reset", rc)
                return False
        return True

    def _reset(self) -> None:
        """After a failed decode: no cells, every sequence unfollowed until it restarts."""
        self._pending = []
        self.ll.llama_memory_clear(self.mem, True)
        for seq in self.seqs:
            self.seqs[seq] = _Seq(lost=True)

    def free(self) -> None:
        if self.ctx:
            self.ll.llama_batch_ext_free(self.batch)
            self.ll.llama_free(self.ctx)
            self.ctx = None
