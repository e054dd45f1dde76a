"""llama.cpp's tokenizer over one model's vocabulary. It only reads the vocabulary, so any
thread may use it (prompts are tokenized on prep threads beside ``llama_decode``)."""

from __future__ import annotations

import ctypes
import re
from typing import Any

from app.base.errors import BadRequest
from app.engine.types import PROTECT_CLOSE, PROTECT_OPEN, VOCAB_TYPES

_PROTECTED = re.compile(f"{PROTECT_OPEN}(.*?){PROTECT_CLOSE}", re.DOTALL)


def vocab_type_name(value: int) -> str:
    return VOCAB_TYPES[value] if 0 <= value < len(VOCAB_TYPES) else str(value)


class Tokenizer:
    """Text to tokens and back, as the engine and the introspection routes need them."""

    def __init__(self, ll: Any, vocab: Any, preserved_texts: tuple[str, ...],
                 user_defined: frozenset[str] = frozenset()):
        self.ll = ll
        self.vocab = vocab
        self.bos = ll.llama_vocab_bos(vocab)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(vocab))
        self._piece_buf = ctypes.create_string_buffer(256)  # the engine thread's, for pieces
        # markers the reply parsers read (tool calls, thoughts): kept in the text even when the
        # model makes them control tokens
        self.preserved = self.control_tokens(preserved_texts)
        # user-defined tokens' texts: llama.cpp matches them even in text tokenized as plain
        # text, so message text holding one is cut before it can (see prompt)
        self.user_defined = user_defined

    def prompt(self, text: str, add_bos: bool) -> list[int]:
        """A prompt's tokens: control tokens parsed, except in protected spans (message text)."""
        if PROTECT_OPEN not in text and PROTECT_CLOSE not in text:
            return self.tokens(text, add_bos)
        parts = _PROTECTED.split(text)  # template, message text, template, ...
        tokens: list[int] = []
        for i, part in enumerate(parts):
            part = part.replace(PROTECT_OPEN, "").replace(PROTECT_CLOSE, "")
            if i % 2 and part in self.user_defined:
                # a user-defined token's text in message text: its first character apart, so
                # llama.cpp cannot match the token (GPT-OSS's <|channel|> written by a client)
                tokens += self.tokens(part[:1], False, special=False)
                tokens += self.tokens(part[1:], False, special=False)
            elif part or i == 0:
                tokens += self.tokens(part, add_bos=add_bos and i == 0, special=i % 2 == 0)
        return tokens

    def tokens(self, text: str, add_bos: bool, special: bool = True) -> list[int]:
        """``text``'s tokens; a BOS the template already wrote is not doubled."""
        ll = self.ll
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("prompt is not valid UTF-8 (a lone surrogate)", param="prompt") from None
        size = len(data) + 2
        buf = (ll.llama_token * size)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, size, add_bos, special)
        if n < 0:
            raise BadRequest("prompt could not be tokenized", param="prompt")
        tokens = buf[:n]
        if add_bos and len(tokens) >= 2 and tokens[0] == tokens[1] == self.bos:
            tokens.pop(0)  # the template already wrote the BOS text
        return tokens

    def exact(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """llama_tokenize with buffers of its own, answering exactly what llama.cpp says (as
        llama-server's /tokenize does: no doubled BOS dropped)."""
        ll = self.ll
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("content is not valid UTF-8 (a lone surrogate)",
                             param="content") from None
        size = len(data) + 8
        for _ in range(2):  # the second try has the size llama.cpp asked for
            buf = (ll.llama_token * size)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, size, add_special,
                                  parse_special)
            if n >= 0:
                return buf[:n]
            size = -n
        raise BadRequest("content could not be tokenized", param="content")

    def piece(self, tok: int) -> bytes:
        """A generated token's bytes (control tokens empty unless preserved). Engine thread."""
        special = tok in self.preserved
        n = self.ll.llama_token_to_piece(self.vocab, tok, self._piece_buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.ll.llama_token_to_piece(self.vocab, tok, buf, -n, 0, special)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's text as bytes, control tokens included (llama-server's pieces); ids
        checked by the caller (llama.cpp does not: an id past the vocabulary crashes it)."""
        ll, vocab = self.ll, self.vocab
        size = 256
        buf = ctypes.create_string_buffer(size)
        out: list[bytes] = []
        for tok in tokens:
            n = ll.llama_token_to_piece(vocab, tok, buf, size, 0, True)
            if n < 0:
                size = -n
                buf = ctypes.create_string_buffer(size)
                n = ll.llama_token_to_piece(vocab, tok, buf, size, 0, True)
            out.append(buf.raw[: max(n, 0)])
        return out

    def text_of(self, tok: int) -> str:
        """A special token's text (BOS, EOS), for the model's card."""
        if tok < 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        n = self.ll.llama_token_to_piece(self.vocab, tok, buf, 256, 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    def single(self, text: str) -> int | None:
        """The token that spells ``text`` on its own (special tokens included), if there is one."""
        toks = self.tokens(text, add_bos=False)
        return toks[0] if len(toks) == 1 else None

    def control_tokens(self, texts: tuple[str, ...]) -> frozenset[int]:
        """Control tokens among ``texts``: detokenized without their text unless preserved."""
        out = set()
        for text in texts:
            tok = self.single(text)
            if tok is not None and self.ll.llama_vocab_is_control(self.vocab, tok):
                out.add(tok)
        return frozenset(out)
