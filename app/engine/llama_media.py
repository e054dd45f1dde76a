"""The vision projector (MMPROJ) through libmtmd: opened beside the model, it turns a decoded
image into the tokens that stand for it in a prompt, and those tokens' embeddings into a
slot's KV cache.

The work is split so that no image holds up the engine's other sequences for longer than one
decode of its tokens:
- ``image_tokens`` runs on a prep thread. libmtmd tokenizes the image alone (the model's own
  image wrapper tokens, if any, come back as text chunks around it) and encodes it with the
  vision tower, the expensive part. The embeddings are copied out, so the chunk can wait in
  the queue without holding libmtmd's one output buffer (encodes take turns on a lock).
- ``decode`` runs on the engine thread, inside a step: one ``llama_decode`` of the image's
  embeddings into the slot's sequence (libmtmd's helper, which also handles models that attend
  to an image both ways).

A prompt keeps one placeholder id per image token, negative (never a vocabulary id) and
derived from 28 bits of the image's digest; each span keeps the full digest beside it, and the
prefix cache compares both (``tokens.common_prefix``): a repeated image matches its cached KV,
and a different one does not, even where the ids collide.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.base.errors import BadRequest, ModelLoadError
from app.engine.tokens import Mark
from app.engine.types import Audio, Frames, Image

log = logging.getLogger(__name__)

_TEXT, _IMAGE, _AUDIO = 0, 1, 2  # mtmd_input_chunk_type


@dataclass(eq=False)
class ImageSpan:
    """An image's tokens in a prompt: from ``start``, ``n`` placeholders; ``embd`` the
    projector's output for them (n x n_embd floats); ``chunk`` libmtmd's chunk (its own copy,
    freed with the job)."""

    start: int
    n: int
    embd: np.ndarray
    chunk: Any
    placeholder: int
    n_pos: int  # positions it takes: n, or its grid's longer side (M-RoPE)
    digest: str  # the image's, in full: what the prefix cache compares (the id holds 28 bits)

    @property
    def mark(self) -> Mark:
        """Where it stands in the prompt, and what it is."""
        return Mark(self.start, self.n, self.digest)


def placeholder(item: Image | Audio | Frames) -> int:
    """The id an image's (or a sound's) tokens take in a prompt's token list: negative, from
    28 bits of its digest (not an identity: ``ImageSpan.digest`` is)."""
    return -1 - int(item.digest[:7], 16)


class Projector:
    """An open mmproj (libmtmd context) over a loaded model."""

    def __init__(self, ll: Any, model: Any, path: str, use_gpu: bool, n_threads: int,
                 cache_bytes: int = 0):
        from llama_cpp import mtmd_cpp as mt  # only a server with MMPROJ loads it

        self.mt, self.ll = mt, ll
        params = mt.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        params.warmup = True
        self.ctx = mt.mtmd_init_from_file(path.encode(), model, params)
        if not self.ctx:
            raise ModelLoadError(
                f"MMPROJ {path}: libmtmd could not load it (not an mmproj GGUF, or made for "
                "another model: its output width must be the model's embedding width)")
        self.vision = bool(mt.mtmd_support_vision(self.ctx))
        # the sample rate it hears at (0: it reads no audio)
        self.audio_rate = (max(0, mt.mtmd_get_audio_sample_rate(self.ctx))
                           if mt.mtmd_support_audio(self.ctx) else 0)
        if not self.vision and not self.audio_rate:
            self.close()
            raise ModelLoadError(f"MMPROJ {path}: the projector reads neither images nor audio")
        self.n_embd = ll.llama_model_n_embd(model)
        self._encoding = threading.Lock()  # one encode at a time: libmtmd has one output buffer
        self._lock = threading.Lock()  # the cache
        self._marker = mt.mtmd_default_marker()
        # recently encoded images, by (key scope, digest): a repeat skips the encoder (the
        # expensive part). Per scope, as the prefix cache is: how fast a request is answered
        # tells no key what another sent
        self._cache: OrderedDict[tuple[str, str], tuple[list[int], list[ImageSpan]]] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self.encodes = 0  # images encoded (for tests and stats)
        self.cache_hits = 0
        self.merges_frames = self.vision and self._merges()

    def _merges(self) -> bool:
        """Whether this projector merges two adjacent mergeable frames into one chunk (asked
        of libmtmd by tokenizing two tiny frames: no encode runs)."""
        mt = self.mt
        rgb = bytes(3 * 32 * 32)
        bitmaps = [mt.mtmd_bitmap_init(32, 32, (ctypes.c_ubyte * len(rgb)).from_buffer_copy(rgb))
                   for _ in range(2)]
        chunks = mt.mtmd_input_chunks_init()
        try:
            for b in bitmaps:
                mt.mtmd_bitmap_set_mergeable(b, True)
            text = mt.mtmd_input_text()
            text.text = self._marker * 2
            text.text_len = len(text.text)
            text.add_special = False
            text.parse_special = True
            if mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text),
                                (ctypes.c_void_p * 2)(*bitmaps), 2) != 0:
                return False
            kinds = [mt.mtmd_input_chunk_get_type(mt.mtmd_input_chunks_get(chunks, i))
                     for i in range(mt.mtmd_input_chunks_size(chunks))]
            return kinds.count(_IMAGE) == 1
        finally:
            mt.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                mt.mtmd_bitmap_free(b)

    def image_tokens(self, image: Image | Audio | Frames, start: int, scope: str = ""
                     ) -> tuple[list[int], list[ImageSpan]]:
        """The tokens an image stands for, from prompt position ``start``: text tokens (the
        model's image wrappers) and ImageSpans (each with a chunk of its own, to free). From
        the cache when this scope sent the same image lately. Prep thread."""
        key = (scope, image.digest)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
                return self._copy(hit, start)
        tokens, spans = self._encode(image, start)
        if self._cache_limit:
            self._remember(key, tokens, spans, start)
        return tokens, spans

    def _copy(self, entry: tuple[list[int], list[ImageSpan]], start: int
              ) -> tuple[list[int], list[ImageSpan]]:
        tokens, spans = entry
        return list(tokens), [ImageSpan(start + s.start, s.n, s.embd,
                                        self.mt.mtmd_input_chunk_copy(s.chunk), s.placeholder,
                                        s.n_pos, s.digest)
                              for s in spans]

    def _remember(self, key: tuple[str, str], tokens: list[int], spans: list[ImageSpan],
                  start: int) -> None:
        size = sum(s.embd.nbytes for s in spans)
        if size > self._cache_limit:
            return
        kept = [ImageSpan(s.start - start, s.n, s.embd, self.mt.mtmd_input_chunk_copy(s.chunk),
                          s.placeholder, s.n_pos, s.digest) for s in spans]
        with self._lock:
            if key in self._cache:
                for s in kept:
                    self.free_span(s)
                return
            self._cache[key] = (list(tokens), kept)
            self._cache_bytes += size
            while self._cache_bytes > self._cache_limit:
                _, (_, old) = self._cache.popitem(last=False)
                self._cache_bytes -= sum(s.embd.nbytes for s in old)
                for s in old:
                    self.free_span(s)

    def _bitmap(self, image: Image | Audio) -> Any:
        mt = self.mt
        if isinstance(image, Audio):
            pcm = (ctypes.c_float * image.samples).from_buffer_copy(image.pcm)
            return mt.mtmd_bitmap_init_from_audio(image.samples, pcm)
        buf = (ctypes.c_ubyte * len(image.rgb)).from_buffer_copy(image.rgb)
        return mt.mtmd_bitmap_init(image.width, image.height, buf)

    def _encode(self, image: Image | Audio | Frames, start: int
                ) -> tuple[list[int], list[ImageSpan]]:
        mt = self.mt
        parts = image.images if isinstance(image, Frames) else (image,)
        bitmaps = [self._bitmap(p) for p in parts]
        chunks = mt.mtmd_input_chunks_init()
        try:
            for b in bitmaps:
                mt.mtmd_bitmap_set_id(b, image.digest.encode())
                if isinstance(image, Frames):  # one chunk for the group: the temporal merge
                    mt.mtmd_bitmap_set_mergeable(b, True)
            text = mt.mtmd_input_text()
            text.text = self._marker * len(bitmaps)
            text.text_len = len(text.text)
            text.add_special = False
            text.parse_special = True
            array = (ctypes.c_void_p * len(bitmaps))(*bitmaps)
            with self._encoding:  # mtmd_tokenize is thread-safe; encode is not: both under it
                rc = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), array, len(bitmaps))
                if rc != 0:
                    raise BadRequest(f"the projector could not read the image (error {rc})",
                                     code="invalid_image")
                self.encodes += 1
                return self._collect(chunks, image, start)
        finally:
            mt.mtmd_input_chunks_free(chunks)
            for b in bitmaps:
                mt.mtmd_bitmap_free(b)

    def _collect(self, chunks: Any, image: Image | Audio | Frames, start: int
                 ) -> tuple[list[int], list[ImageSpan]]:
        mt = self.mt
        tokens: list[int] = []
        spans: list[ImageSpan] = []
        pid = placeholder(image)
        for i in range(mt.mtmd_input_chunks_size(chunks)):
            chunk = mt.mtmd_input_chunks_get(chunks, i)
            kind = mt.mtmd_input_chunk_get_type(chunk)
            if kind == _TEXT:
                n = ctypes.c_size_t(0)
                ids = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(ids[k] for k in range(n.value))
                continue
            if kind not in (_IMAGE, _AUDIO):
                raise BadRequest("the projector made a chunk this server cannot decode",
                                 code="invalid_image")
            n_tok = mt.mtmd_input_chunk_get_n_tokens(chunk)
            if mt.mtmd_encode_chunk(self.ctx, chunk) != 0:
                raise BadRequest("the projector could not encode the image", code="invalid_image")
            out = mt.mtmd_get_output_embd(self.ctx)
            embd = np.ctypeslib.as_array(out, shape=(n_tok * self.n_embd,)).copy()
            spans.append(ImageSpan(start + len(tokens), n_tok, embd,
                                   mt.mtmd_input_chunk_copy(chunk), pid,
                                   mt.mtmd_input_chunk_get_n_pos(chunk), image.digest))
            tokens.extend([pid] * n_tok)
        return tokens, spans

    def decode(self, lctx: Any, span: ImageSpan, n_past: int, seq_id: int, n_batch: int) -> int:
        """The image's embeddings into ``seq_id``'s KV from position ``n_past``; the position
        after it (n_past + its n_pos), or -1 if llama.cpp refused the decode. Engine thread."""
        mt = self.mt
        new_n_past = ctypes.c_int32(0)
        rc = mt.mtmd_helper_decode_image_chunk(
            self.ctx, lctx, span.chunk, span.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            n_past, seq_id, n_batch, ctypes.byref(new_n_past),
            mt.mtmd_helper_post_decode_callback(), None)
        return new_n_past.value if rc == 0 else -1

    def free_span(self, span: ImageSpan) -> None:
        if span.chunk:
            self.mt.mtmd_input_chunk_free(span.chunk)
            span.chunk = None

    def close(self) -> None:
        for _, spans in self._cache.values():
            for span in spans:
                self.free_span(span)
        self._cache.clear()
        self._cache_bytes = 0
        if self.ctx:
            self.mt.mtmd_free(self.ctx)
            self.ctx = None
