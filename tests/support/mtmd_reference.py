"""libmtmd's own evaluation of a prompt with images, then greedy tokens: what a correct server
generates, for the vision and video tests (tests/e2e/test_vision.py, tests/e2e/test_video.py).
Positions after the prompt are llama.cpp's own (from the KV's last: M-RoPE takes every axis
from it), never set by hand."""

from __future__ import annotations

import ctypes
from pathlib import Path


def reference_answer(model: Path, proj: Path, prompt: str,
                     images: list[tuple[bytes, int, int]], n: int,
                     mergeable: bool = False) -> list[int]:
    """``prompt`` (libmtmd's marker where each image goes) with ``images`` (RGB bytes, width,
    height; each mergeable with its neighbour when ``mergeable``, as llama.cpp's video path
    makes frames), evaluated by libmtmd, then ``n`` greedy tokens."""
    from llama_cpp import llama_cpp as ll
    from llama_cpp import mtmd_cpp as mt

    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    mparams.n_gpu_layers = 0
    m = ll.llama_model_load_from_file(str(model).encode(), mparams)
    cparams = ll.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch = 1024, 512
    ctx = ll.llama_init_from_model(m, cparams)
    mp = mt.mtmd_context_params_default()
    mp.use_gpu, mp.print_timings = False, False
    mc = mt.mtmd_init_from_file(str(proj).encode(), m, mp)
    bitmaps = []
    for rgb, w, h in images:
        b = mt.mtmd_bitmap_init(w, h, (ctypes.c_ubyte * len(rgb)).from_buffer_copy(rgb))
        if mergeable:
            mt.mtmd_bitmap_set_mergeable(b, True)
        bitmaps.append(b)
    chunks = mt.mtmd_input_chunks_init()
    text = mt.mtmd_input_text()
    text.text = prompt.encode()
    text.text_len = len(text.text)
    text.add_special, text.parse_special = False, True
    try:
        assert mt.mtmd_tokenize(mc, chunks, ctypes.byref(text),
                                (ctypes.c_void_p * len(bitmaps))(*bitmaps), len(bitmaps)) == 0
        n_past = ctypes.c_int32(0)
        assert mt.mtmd_helper_eval_chunks(mc, ctx, chunks, 0, 0, 512, True,
                                          ctypes.byref(n_past)) == 0
        n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(m))
        out = []
        for _ in range(n):  # bounded by n
            logits = ll.llama_get_logits_ith(ctx, -1)
            tok = max(range(n_vocab), key=lambda t: logits[t])
            out.append(tok)
            assert ll.llama_decode(ctx, ll.llama_batch_get_one((ll.llama_token * 1)(tok), 1)) == 0
        return out
    finally:
        mt.mtmd_input_chunks_free(chunks)
        for b in bitmaps:
            mt.mtmd_bitmap_free(b)
        mt.mtmd_free(mc)
        ll.llama_free(ctx)
        ll.llama_model_free(m)
