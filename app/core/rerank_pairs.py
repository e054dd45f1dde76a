"""A (query, document) pair made into a reranker's tokens, as llama-server makes it
(format_prompt_rerank), and fitted to the context as the request asks.

Without a rerank template (cross-encoders): ``prefix + query + middle + document + suffix``,
each text tokenized as plain text. With one (decoder rerankers: Qwen3-Reranker's system and
user turns around ``{query}`` and ``{document}``): the template filled in. llama-server
tokenizes the filled-in template with control tokens parsed, which lets a query or document
that holds ``<|im_end|>`` end the turn; here the template is split at its control tokens once,
and each stretch of text between them is tokenized as plain text with the query and document in
place. llama.cpp's own tokenizer cuts text at control tokens before it tokenizes the rest, so an
ordinary pair gets exactly llama-server's tokens, and control-token text a caller sends stays
text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from app.base.errors import ContextOverflow
from app.engine.embed import RankInfo

Overflow = Literal["error", "truncate", "chunk"]


@dataclass(frozen=True)
class Fit:
    """What to do with a pair that does not fit. ``overflow``: error (a 400 naming the
    document), truncate (the document keeps its first tokens) or chunk (Cohere v1: a long
    document is scored in up to ``chunks`` pieces, and its best piece's score is its score).
    ``max_doc_tokens`` cuts every document first (Cohere's max_tokens_per_doc);
    ``max_pair_tokens`` bounds a pair below the context (vLLM's truncate_prompt_tokens).
    ``first`` / ``second`` name the two sides in errors ("documents[3]"); ``first_indexed``:
    the first side is a list too (vLLM's /score)."""

    overflow: Overflow = "error"
    chunks: int = 1
    max_doc_tokens: int | None = None
    max_pair_tokens: int | None = None
    first: str = "query"
    second: str = "documents"
    first_indexed: bool = False


_SLOTS = re.compile(r"\{query\}|\{document\}")

Tokenize = Callable[[str, bool, bool], list[int]]  # (text, add_special, parse_special)
Pieces = Callable[[list[int]], list[bytes]]


@dataclass
class Built:
    chunks: list[list[int]] = field(default_factory=list)  # one sequence each
    truncated: bool = False


def split_template(template: str, specials: tuple[str, ...], tokenize: Tokenize) -> list[int | str]:
    """The template as control tokens (their ids) and the text between them."""
    found = sorted({s for s in specials if s and s in template}, key=len, reverse=True)
    if not found:
        return [template]
    out: list[int | str] = []
    for part in re.split("(" + "|".join(map(re.escape, found)) + ")", template):
        if not part:
            continue
        toks = tokenize(part, False, True) if part in found else []
        out.append(toks[0] if len(toks) == 1 else part)
    return out


class PairMaker:
    """Tokens for a request's pairs, on a worker thread (tokenizing reads only the
    vocabulary). Queries are tokenized once per request."""

    def __init__(self, rank: RankInfo, n_ctx: int, tokenize: Tokenize, pieces: Pieces,
                 specials: tuple[str, ...]):
        self.rank = rank
        self.n_ctx = n_ctx
        self.tokenize = tokenize
        self.pieces = pieces
        self.segments = (split_template(rank.template, specials, tokenize)
                         if rank.template is not None else None)
        self._queries: dict[str, list[int]] = {}

    # ---- the two forms --------------------------------------------------------------------
    def text(self, s: str) -> list[int]:
        return self.tokenize(s, False, False) if s else []

    def pair(self, query: str, doc: str) -> list[int]:
        """The pair's tokens, unfitted."""
        if self.segments is None:
            r = self.rank
            return [*r.prefix, *self.query(query), *r.middle, *self.text(doc), *r.suffix]
        out: list[int] = []
        for seg in self.segments:
            if isinstance(seg, int):
                out.append(seg)
            else:  # one pass: a query holding "{document}" is not filled in again
                out += self.text(_SLOTS.sub(
                    lambda m: query if m.group() == "{query}" else doc, seg))
        return out

    def query(self, q: str) -> list[int]:
        toks = self._queries.get(q)
        if toks is None:
            toks = self._queries[q] = self.text(q)
        return toks

    def detok(self, toks: list[int]) -> str:
        return b"".join(self.pieces(toks)).decode("utf-8", "ignore")

    # ---- fitting ---------------------------------------------------------------------------
    def build_all(self, pairs: tuple[tuple[str, str], ...], fit: Fit) -> list[Built]:
        return [self.build(i, q, d, fit) for i, (q, d) in enumerate(pairs)]

    def build(self, i: int, query: str, doc: str, inp: Fit) -> Built:
        limit = min(self.n_ctx, inp.max_pair_tokens or self.n_ctx)
        out = Built()
        if inp.max_doc_tokens is not None or self.segments is None:
            dtoks = self.text(doc)
            if inp.max_doc_tokens is not None and len(dtoks) > inp.max_doc_tokens:
                dtoks = dtoks[:inp.max_doc_tokens]
                doc = self.detok(dtoks) if self.segments is not None else doc
                out.truncated = True
            if self.segments is None:
                return self._framed(i, query, dtoks, limit, inp, out)
        toks = self.pair(query, doc)
        if len(toks) <= limit:
            out.chunks.append(toks)
            return out
        self._refuse(i, len(toks), limit, inp)
        return self._templated(i, query, doc, len(toks) - limit, limit, inp, out)

    def _framed(self, i: int, query: str, dtoks: list[int], limit: int, inp: Fit,
                out: Built) -> Built:
        r = self.rank
        head = [*r.prefix, *self.query(query), *r.middle]
        room = limit - len(head) - len(r.suffix)
        if len(dtoks) <= room:
            out.chunks.append(head + dtoks + list(r.suffix))
            return out
        self._refuse(i, len(head) + len(dtoks) + len(r.suffix), limit, inp)
        if room < 1:
            self._no_room(i, inp, limit)
        pieces = [dtoks[k:k + room] for k in range(0, len(dtoks), room)]
        keep = pieces[:max(1, inp.chunks) if inp.overflow == "chunk" else 1]
        out.chunks += [head + p + list(r.suffix) for p in keep]
        out.truncated = True if len(keep) < len(pieces) else out.truncated
        return out

    def _templated(self, i: int, query: str, doc: str, over: int, limit: int,
                   inp: Fit, out: Built) -> Built:
        """Cut the document's text (through its tokens) until the filled-in template fits:
        the text around a cut may tokenize a token longer or shorter, hence the retries."""
        dtoks = self.text(doc)
        size = len(dtoks) - over
        if size < 1:
            self._no_room(i, inp, limit)
        pieces = [dtoks[k:k + size] for k in range(0, len(dtoks), size)]
        keep = pieces[:max(1, inp.chunks) if inp.overflow == "chunk" else 1]
        for piece in keep:
            for _ in range(8):  # bounded: each try drops what overflowed, at least a token
                toks = self.pair(query, self.detok(piece))
                if len(toks) <= limit or len(piece) <= 1:
                    break
                piece = piece[:len(piece) - max(1, len(toks) - limit)]
            if len(toks) > limit:
                self._no_room(i, inp, limit)
            out.chunks.append(toks)
        out.truncated = True
        return out

    def _refuse(self, i: int, n: int, limit: int, inp: Fit) -> None:
        if inp.overflow == "error":
            raise ContextOverflow(
                f"{inp.second}[{i}]: the pair (query and document, with the model's own "
                f"tokens) is {n} tokens, over the {limit} a pair may have"
                + (" (EMBEDDING_CTX)" if limit == self.n_ctx else "")
                + ": shorten it, or ask for truncation", param=inp.second, tokens=n,
                limit=limit)

    def _no_room(self, i: int, inp: Fit, limit: int) -> None:
        name = f"{inp.first}[{i}]" if inp.first_indexed else inp.first
        raise ContextOverflow(
            f"{name}: the query leaves no room for a document in the {limit} tokens a pair "
            "may have: shorten it", param=inp.first, limit=limit)

