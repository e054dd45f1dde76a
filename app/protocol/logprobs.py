"""Token log probabilities in OpenAI's wire shapes, as pure functions over the engine's scores.

Two shapes: the list Chat Completions and Responses use (``{token, logprob, bytes,
top_logprobs}`` per token) and the legacy object of Completions (``{tokens, token_logprobs,
top_logprobs, text_offset}``), which eval harnesses (lm-eval) read, prompt tokens included when
``echo`` asks for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from app.engine.types import TokenScore

MAX_TOP = 20  # most alternatives per position a request may ask for (OpenAI's and vLLM's cap)


def token_text(piece: bytes, token: int | None = None) -> str:
    """A token's text: its bytes as UTF-8, a partial character shown as U+FFFD (``bytes``
    keeps the exact bytes, so a client can join the pieces of a character); with ``token``,
    ``token_id:<id>`` instead (vLLM's ``return_tokens_as_token_ids``: exact even where two
    tokens spell the same text)."""
    return piece.decode("utf-8", "replace") if token is None else f"token_id:{token}"


def chat_entry(s: TokenScore, as_ids: bool = False) -> dict[str, Any]:
    """One token as Chat Completions and Responses show it."""
    return {
        "token": token_text(s.piece, s.token if as_ids else None),
        "logprob": s.logprob,
        "bytes": list(s.piece),
        "top_logprobs": [{"token": token_text(p, t if as_ids else None), "logprob": lp,
                          "bytes": list(p)} for t, p, lp in s.top],
    }


def chat_list(scores: Iterable[TokenScore], as_ids: bool = False) -> list[dict[str, Any]]:
    return [chat_entry(s, as_ids) for s in scores]


def chat_logprobs(scores: Iterable[TokenScore], as_ids: bool = False) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs`` object."""
    return {"content": chat_list(scores, as_ids), "refusal": None}


def legacy(scores: Sequence[TokenScore], offsets: Sequence[int],
           as_ids: bool = False) -> dict[str, Any]:
    """Completions' ``logprobs`` object. Each position's ``top_logprobs`` holds the asked-for
    alternatives and always the token itself (so up to N+1 entries, as OpenAI documents); a
    prompt's first token, which nothing predicts, has null for both."""
    def text(piece: bytes, token: int) -> str:
        return token_text(piece, token if as_ids else None)

    tops: list[dict[str, float] | None] = []
    for s in scores:
        if s.logprob is None:
            tops.append(None)
            continue
        top = {text(p, t): lp for t, p, lp in s.top}
        top.setdefault(text(s.piece, s.token), s.logprob)
        tops.append(top)
    return {
        "tokens": [text(s.piece, s.token) for s in scores],
        "token_logprobs": [s.logprob for s in scores],
        "top_logprobs": tops,
        "text_offset": list(offsets),
    }


def generated_offsets(scores: Iterable[TokenScore], start: int) -> list[int]:
    """Where generated tokens start in the completion's text, which begins with ``start``
    characters of echoed prompt."""
    return [start + s.offset for s in scores]


def prompt_offsets(scores: Sequence[TokenScore], text: str) -> list[int]:
    """Where each prompt token starts in the prompt's ``text``, in characters, found by
    matching the tokens' bytes along the text: a token whose bytes are not there (a BOS the
    tokenizer added) takes no room; a leading space the tokenizer added (SentencePiece's) is
    skipped."""
    data = text.encode("utf-8", "surrogatepass")
    out: list[int] = []
    pos = 0  # bytes matched so far
    chars = 0  # characters begun in data[:pos]
    for s in scores:
        out.append(chars)
        piece = s.piece
        if piece and data.startswith(piece, pos):
            end = pos + len(piece)
        elif len(piece) > 1 and piece[:1] == b" " and data.startswith(piece[1:], pos):
            end = pos + len(piece) - 1
        else:
            continue
        chars += sum(1 for b in data[pos:end] if b & 0xC0 != 0x80)
        pos = end
    return out
