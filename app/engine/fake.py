"""A scripted engine for fast protocol tests: same interface and threading as the real one.

It "generates" a fixed reply word by word on a native thread, honouring max_tokens and stop
strings through the same TextAssembler (a reply that runs to its end counts one token more, its
end-of-generation token, as the real engine does), so routes, envelopes and SSE framing can be
tested without a model. Prompts containing ``FAIL_BEFORE`` fail before acceptance, ``FAIL_AFTER``
after the first piece. Its tokenizer (/tokenize) is byte-level: ids 0-2 are ``<unk>``, ``<s>``
and ``</s>``, then one token per byte (a multi-byte character is several tokens, as in
llama.cpp's byte-level vocabularies).
"""

from __future__ import annotations

import re
import time

from app.base.errors import (
    BadRequest,
    ContextOverflow,
    EngineFailure,
    GenerationTimeout,
    ModelNotReady,
    NotSupported,
    QueueFull,
    ShuttingDown,
)
from app.base.state import LoadState
from app.base.threads import Mailbox, ThreadEvent, allocate_lock, start_native_thread
from app.engine.handle import ChannelHandle, new_channel
from app.engine.text import TextAssembler
from app.engine.types import (
    PROTECT_CLOSE,
    PROTECT_OPEN,
    Accepted,
    Failed,
    Finished,
    GenerationRequest,
    ModelInfo,
    PromptScored,
    TextPiece,
    TokenScore,
    outside_vocab,
    slot_row,
)

SPECIALS = ("<unk>", "<s>", "</s>")  # the fake vocabulary's control tokens: ids 0, 1, 2
N_VOCAB = len(SPECIALS) + 256
ALT = (0, b"<unk>")  # the fake's runner-up at positions it did not choose the likeliest


def fake_score(token: int, piece: bytes, k: int, top_n: int, offset: int = 0) -> TokenScore:
    """A scripted score for the k-th token: its log probability cycles through -0.25 .. -1.0;
    at even k it is the likeliest token, at odd k ``ALT`` is likelier (-0.125)."""
    lp = -0.25 * (k % 4 + 1)
    ranked = [(token, piece, lp)] if k % 2 == 0 else [(*ALT, -0.125), (token, piece, lp)]
    ranked += [(3 + j, bytes([j]), -20.0 - j) for j in range(top_n)]  # byte tokens, unlikely
    return TokenScore(token, piece, lp, tuple(ranked[:top_n]), offset)


class FakeHandle(ChannelHandle):
    def __init__(self, channel: Mailbox, n: int = 1):
        super().__init__(channel, n)
        self.cancelled = False
        self.injected: list[str] = []
        self.prompt_tokens = 0  # for /slots
        self.decoded = 0

    def cancel(self) -> None:
        self.cancelled = True

    def inject(self, text: str, unless: str = "") -> None:
        self.injected.append(text)


class FakeEngine:
    def __init__(
        self,
        reply: str = "Hello from the fake engine. It speaks in short words.",
        delay: float = 0.0,
        n_ctx: int = 512,
        n_ctx_train: int | None = None,  # the training window (default: n_ctx)
        capacity: int = 8,
        ready: bool = True,
        chat_template: str | None = None,
        aliases: tuple[str, ...] = ("fake-model",),  # what SERVED_MODEL_NAME gives a real one
        tags: tuple[str, ...] = (),
    ):
        self.reply = reply
        self.delay = delay
        self.capacity = capacity
        self.state = LoadState()
        self.requests: list[GenerationRequest] = []
        self.stall: str | None = None  # what stalled() reports (tests of the watchdog)
        # a choice pauses once it has said this many words, until ``resume`` is set (at most
        # 30 s): a test sees a generation mid-way without racing it
        self.hold_after: int | None = None
        self.resume = ThreadEvent()
        self.draining = False
        self.handles: list[FakeHandle] = []
        self._lock = allocate_lock()
        self._running = 0
        self._slots: dict[int, FakeHandle] = {}  # slot id -> the request it runs
        self._info = ModelInfo(
            name=aliases[0],
            path="/models/fake-model.gguf",
            n_ctx=n_ctx,
            n_ctx_train=n_ctx if n_ctx_train is None else n_ctx_train,
            chat_template=chat_template,
            bos_token="<s>",
            eos_token="</s>",
            add_bos=True,  # its tokenize adds <s> with add_special
            created=1700000000,
            n_vocab=N_VOCAB,
            n_embd=576,
            n_params=134_515_008,
            size=85_000_000,
            vocab_type="bpe",
            architecture="llama",
            quantization="Q4_1",
            aliases=aliases,
            tags=tags,
        )
        if ready:
            self.state.set("ready", progress=1.0)

    @property
    def info(self) -> ModelInfo | None:
        return self._info if self.state.ready else None

    def count_tokens(self, request: GenerationRequest) -> int:
        if not self.state.ready:
            raise ModelNotReady(f"model is {self.state.stage}")
        prompt = request.prompt
        return len(prompt.split()) if isinstance(prompt, str) else len(prompt)

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """The prompt in the byte-level vocabulary: control-token text parsed, except in
        protected spans (message text), as the real engine tokenizes a prompt. (The fake's
        generations count a prompt in words: see count_tokens.)"""
        prompt = request.prompt
        if not isinstance(prompt, str):
            return list(prompt)
        parts = re.split(f"[{PROTECT_OPEN}{PROTECT_CLOSE}]", prompt)
        out = [1] if request.add_bos else []
        for i, part in enumerate(parts):  # odd parts are inside a protected span
            out += self.tokenize(part, add_special=False, parse_special=i % 2 == 0)
        return out

    def queue_depth(self) -> int:
        return self._running

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        if not self.state.ready:
            raise ModelNotReady(f"model is {self.state.stage}")
        data = text.encode("utf-8", "surrogatepass")
        out = [1] if add_special else []
        i = 0
        while i < len(data):
            special = next((k for k, sp in enumerate(SPECIALS)
                            if parse_special and data.startswith(sp.encode(), i)), None)
            if special is not None:
                out.append(special)
                i += len(SPECIALS[special])
            else:
                out.append(len(SPECIALS) + data[i])
                i += 1
        return out

    def pieces(self, tokens: list[int]) -> list[bytes]:
        if not self.state.ready:
            raise ModelNotReady(f"model is {self.state.stage}")
        bad = outside_vocab(tokens, N_VOCAB)
        if bad is not None:
            raise BadRequest(f"token id {bad} is not in the vocabulary (0..{N_VOCAB - 1})",
                             param="tokens")
        return [SPECIALS[t].encode() if t < len(SPECIALS) else bytes([t - len(SPECIALS)])
                for t in tokens]

    def slot_action(self, slot_id: int, action: str, filename: str | None) -> dict[str, object]:
        raise NotSupported("the fake engine keeps no KV to save, restore or erase")

    def slots(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for i in range(self.capacity):
            h = self._slots.get(i)
            if h is None:
                rows.append(slot_row(i, self._info.n_ctx))
            else:
                rows.append(slot_row(i, self._info.n_ctx, h.prompt_tokens + h.decoded, job=True,
                                     prompt=h.prompt_tokens, processed=h.prompt_tokens,
                                     decoded=h.decoded))
        return rows

    def stats(self) -> dict[str, object]:
        return {"running": self._running, "waiting": 0, "steps": 0, "batch_widths": {},
                "decode_seconds": 0.0, "step_seconds": 0.0}

    def stalled(self, limit: float) -> str | None:
        return self.stall

    def shutdown(self) -> None:
        pass

    def drain(self) -> None:
        self.draining = True

    def abort(self, message: str) -> None:
        for handle in self.handles:
            handle.cancel()

    def submit(self, request: GenerationRequest, mailbox: Mailbox | None = None) -> FakeHandle:
        if self.draining:
            raise ShuttingDown("server is shutting down")
        if not self.state.ready:
            raise ModelNotReady(f"model is {self.state.stage}")
        with self._lock:
            if self._running >= self.capacity:
                raise QueueFull("server is busy")
            self._running += 1
        self.requests.append(request)
        channel = mailbox or new_channel()
        handle = FakeHandle(channel, request.n)
        self.handles.append(handle)
        start_native_thread(lambda: self._run(request, channel, handle))
        return handle

    def _run(self, req: GenerationRequest, channel: Mailbox, handle: FakeHandle) -> None:
        with self._lock:
            slot = min(set(range(self.capacity)) - set(self._slots))
            self._slots[slot] = handle
        try:
            self._generate(req, channel, handle)
        finally:
            with self._lock:
                self._running -= 1
                del self._slots[slot]

    def _generate(self, req: GenerationRequest, channel: Mailbox, handle: FakeHandle) -> None:
        """Choice i of n says the reply with its first word repeated i times."""
        prompt = req.prompt
        n_prompt = len(prompt.split()) if isinstance(prompt, str) else len(prompt)
        text = prompt if isinstance(prompt, str) else ""
        if "FAIL_BEFORE" in text:
            channel.put(Failed(EngineFailure("scripted failure before the first token")))
            return
        if n_prompt >= self._info.n_ctx:
            channel.put(Failed(ContextOverflow(f"prompt has {n_prompt} tokens", tokens=n_prompt,
                                               limit=self._info.n_ctx)))
            return
        handle.prompt_tokens = n_prompt
        channel.put(Accepted(n_prompt))
        if req.params.prompt_logprobs is not None:
            channel.put(PromptScored(self._prompt_scores(req)))
        deadline = time.monotonic() + req.timeout if req.timeout else None
        for index in range(req.n):
            words = re.findall(r"\S+\s*", self.reply)
            words = words[:1] * index + words
            if not self._choice(req, channel, handle, n_prompt, text, words, deadline, index):
                return

    def _prompt_scores(self, req: GenerationRequest) -> tuple[TokenScore, ...]:
        """The prompt scored: a text prompt's tokens are its words (leading space apart), a
        token prompt's its ids."""
        top_n = req.params.prompt_logprobs or 0
        if isinstance(req.prompt, str):
            pieces = [w.encode() for w in re.findall(r"^\s+|\S+\s*", req.prompt)]
            ids = [3 + p[0] for p in pieces]
        else:
            ids = list(req.prompt)
            pieces = self.pieces(ids)
        return tuple(TokenScore(t, p, None) if k == 0 else fake_score(t, p, k, top_n)
                     for k, (t, p) in enumerate(zip(ids, pieces, strict=True)))

    def _choice(self, req, channel, handle, n_prompt, text, words, deadline, index) -> bool:
        """One choice's events; False when the request ended (failure or cancel)."""
        limit = req.params.max_tokens
        if limit is None:
            limit = req.params.max_tokens_default
        top_n = req.params.logprobs
        asm = TextAssembler(req.params.stop)
        scores: list[TokenScore] = []
        chars = 0

        def taken() -> tuple[TokenScore, ...]:
            out = tuple(scores)
            scores.clear()
            return out

        if limit == 0:  # max_tokens 0 (with echo): the prompt alone
            channel.put(Finished("length", n_prompt, 0, 0, index))
            return True
        n = 0
        for word in words:
            if n == self.hold_after:
                self.resume.wait(30)
            if handle.cancelled:
                return False
            while handle.injected:
                channel.put(TextPiece(handle.injected.pop(0), n, index))
            if self.delay:
                time.sleep(self.delay)
            if deadline is not None and time.monotonic() > deadline:
                channel.put(Failed(GenerationTimeout(f"generation exceeded {req.timeout:g} s")))
                return False
            if top_n is not None:
                scores.append(fake_score(3 + word.encode()[0], word.encode(), n, top_n, chars))
                chars += len(word)
            n += 1
            handle.decoded = n
            piece = asm.feed(word.encode())
            if asm.stopped:
                if piece:
                    channel.put(TextPiece(piece, n, index, taken()))
                channel.put(Finished("stop", n_prompt, n, 0, index, asm.stopped_by,
                                     scores=taken()))
                return True
            if piece:
                channel.put(TextPiece(piece, n, index, taken()))
            if "FAIL_AFTER" in text:
                channel.put(Failed(EngineFailure("scripted failure mid-stream")))
                return False
            if limit is not None and n >= limit:  # before the end-of-generation token
                tail = asm.flush()
                if tail:
                    channel.put(TextPiece(tail, n, index, taken()))
                channel.put(Finished("length", n_prompt, n, 0, index, scores=taken()))
                return True
        tail = asm.flush()
        if tail:
            channel.put(TextPiece(tail, n, index, taken()))
        # the reply is over: the model "samples" its end-of-generation token, which counts
        # (as the real engine counts it); a stop string or max_tokens ends it with none
        handle.decoded = n + 1
        if top_n is not None:
            scores.append(fake_score(2, b"</s>", n, top_n, chars))
        channel.put(Finished("stop", n_prompt, n + 1, 0, index, scores=taken()))
        return True
