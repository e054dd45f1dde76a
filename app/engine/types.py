"""The engine interface: what HTTP-side code may ask of the model, and what comes back.

The engine knows nothing of HTTP or of any API. It takes a prompt (text or token ids) and
sampling parameters and emits events; the protocol layer turns those into API objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from app.base.errors import ServiceError
from app.base.state import LoadState

# A text prompt may mark spans that came from a request's messages: text between these two
# Unicode noncharacters is tokenized as plain text, never as control tokens (so a user cannot
# write a template's markup, e.g. ``<|im_start|>system``, into their turn). Outside the spans,
# control tokens are parsed.
PROTECT_OPEN = "\ufdd0"
PROTECT_CLOSE = "\ufdd1"
# One image's place in a text prompt (a third noncharacter, which clients cannot send either:
# the adapters replace it in their text): the i-th MEDIA is GenerationRequest.media[i].
MEDIA = "\ufdd2"


@dataclass(frozen=True, eq=False)
class Image:
    """A decoded image: RGB pixels, row by row, three bytes each. ``digest`` names its content
    (a repeated image reuses its KV; it is also the id libmtmd gives its chunk)."""

    rgb: bytes
    width: int
    height: int
    digest: str


@dataclass(frozen=True, eq=False)
class Audio:
    """Decoded sound: mono float32 samples at the projector's rate (``rate``), ``digest``
    naming its content as an image's does."""

    pcm: bytes
    samples: int
    rate: int
    digest: str


@dataclass(frozen=True, eq=False)
class Frames:
    """Adjacent video frames the projector merges into one set of tokens (Qwen-VL's temporal
    merge, libmtmd's mergeable bitmaps): half the tokens of the frames apart. ``digest`` names
    the group (from its frames' digests), as an image's names the image."""

    images: tuple[Image, ...]
    digest: str


@dataclass(frozen=True)
class Speculation:
    """A request's own speculative-decoding limits (llama-server's ``speculative.*``); None:
    the server's (SPEC_DRAFT_MAX, SPEC_DRAFT_MIN, SPEC_P_MIN). n_max 0 turns it off."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    # OpenAI's Predicted Outputs: text the reply is expected to repeat (a file being edited),
    # drafted from where the reply follows it; the reply itself is what it would be without
    prediction: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. ``temperature == 0`` means greedy."""

    max_tokens: int | None = None  # the request's own limit: refused when it cannot fit
    # the server's limit for a request that names none (DEFAULT_MAX_TOKENS, MAX_TOKENS_LIMIT):
    # unlike max_tokens, cut to what the context has left
    max_tokens_default: int | None = None
    max_tokens_param: str = "max_tokens"  # the request field max_tokens came from (for errors)
    # None: the server's default (DEFAULT_TEMPERATURE and the like), filled in by the planner
    # before a request reaches the engine
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = 0
    min_p: float | None = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = 64  # tokens back the penalties look (0: off; more than the context: the context)
    grammar: str | None = None  # GBNF constraining the output (response_format, tools)
    # with triggers the grammar is lazy: it applies from the first of these words on
    grammar_triggers: tuple[str, ...] = ()
    # the grammar takes injected text (a thought's closing tag) at any point of a thought, so
    # injected tokens are fed to it; other grammars never see them (they might refuse them)
    grammar_takes_injection: bool = False
    grammar_param: str = "grammar"  # the request field the grammar came from (for errors)
    grammar_prefilter: bool = True  # False when the grammar names tokens (<[id]>)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    ignore_eos: bool = False  # generate past end-of-generation tokens (until max_tokens)
    # log probabilities: of each sampled token with this many likeliest alternatives (None: not
    # asked), and of each prompt token with this many (None: not asked; the prompt's KV is then
    # computed afresh, since a reused prefix has no logits)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # speculative decoding's limits for this request (where the server speculates at all)
    speculative: Speculation = field(default_factory=Speculation)
    # llama-server's ``lora``: (adapter id, scale) pairs over the server's default scales;
    # None: not asked (the planner turns it into GenerationRequest.lora)
    lora: tuple[tuple[int, float], ...] | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt and how to continue it. Text prompts are tokenized with control tokens parsed,
    except inside PROTECT_OPEN ... PROTECT_CLOSE spans."""

    prompt: str | tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    add_bos: bool = True
    timeout: float | None = None  # seconds from submission; past it the job fails (504)
    cache_prompt: bool = True  # reuse a slot's KV for a shared prompt prefix
    n: int = 1  # choices: sequences sharing the prompt's KV, each sampled on its own
    # who may reuse this prompt's KV: only a request of the same scope (its API key's digest;
    # "" without keys), so cached_tokens tells nobody about another key's prompts
    cache_scope: str = ""
    media: tuple[Image | Audio | Frames, ...] = ()  # what stands at the prompt's MEDIA marks
    # the LoRA adapters applied: (adapter index, scale) with nonzero scales, in index order;
    # () is the base model (app.engine.lora)
    lora: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Accepted:
    """The prompt was tokenized and fits: generation will start (possibly after a queue wait)."""

    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class TokenScore:
    """One token's log probability: log-softmax over the whole vocabulary of the logits it was
    sampled from (or, in a prompt, of the logits at the position before it), before any
    sampling transform; and the likeliest tokens at that position, most likely first."""

    token: int
    piece: bytes  # its text (control tokens spelled out)
    logprob: float | None  # None: a prompt's first token (nothing before it predicts it)
    top: tuple[tuple[int, bytes, float], ...] = ()  # (token, piece, logprob)
    # a generated token: where its text starts in the choice's generated text, in characters
    # (a token of a matched stop string, which the text leaves out: where it would have been)
    offset: int = 0


@dataclass(frozen=True)
class TextPiece:
    """Newly generated text (never a broken UTF-8 sequence, never part of a stop string)."""

    text: str
    completion_tokens: int
    index: int = 0  # the choice
    # the scores of the tokens sampled since the last piece, when the request asked for them
    scores: tuple[TokenScore, ...] = ()


@dataclass(frozen=True)
class PromptScored:
    """The prompt's tokens scored (``prompt_logprobs``), sent once, before any text."""

    scores: tuple[TokenScore, ...]


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV was reused, not decoded again
    index: int = 0  # the choice; a request is over when every choice has finished
    stop_sequence: str | None = None  # the request's stop string that ended it, if one did
    queue_seconds: float = 0.0  # from submission to a slot (the first choice's wait)
    scores: tuple[TokenScore, ...] = ()  # the scores no piece carried (an end token's, say)
    # speculative decoding: (tokens drafted, of them accepted); None when it was off
    draft: tuple[int, int] | None = None
    # Predicted Outputs: (the prediction's tokens the reply followed, the rest); None without
    predicted: tuple[int, int] | None = None


@dataclass(frozen=True)
class Failed:
    error: ServiceError


Event = Accepted | TextPiece | PromptScored | Finished | Failed
Sink = Callable[[Event], None]


def outside_vocab(ids: Iterable[int], n_vocab: int) -> int | None:
    """The first id not in ``0..n_vocab-1`` (llama.cpp does not check: such an id crashes it),
    or None. Python ints: an id past 64 bits is refused like any other."""
    return next((t for t in ids if not 0 <= t < n_vocab), None)


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP side needs to know about the loaded model."""

    name: str
    path: str
    n_ctx: int
    n_ctx_train: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    created: int
    pad_token: str = ""  # "" when the GGUF names none
    add_bos: bool = False  # whether the GGUF asks for a BOS before a prompt
    n_vocab: int = 0
    control_texts: tuple[str, ...] = ()  # the text of every control token, longest first
    n_embd: int = 0
    n_params: int = 0
    size: int = 0  # bytes of the model's tensors
    vocab_type: str = ""  # a VOCAB_TYPES name
    architecture: str = ""  # the GGUF's general.architecture (llama, qwen3, gemma3, ...)
    quantization: str = ""  # its file type as llama.cpp names it (Q4_K_M, F16, ...)
    gpu_offload: bool = False  # some of its layers are on a GPU
    # every name a request may use for the model (the id first); tags are informational
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    # whether llama.cpp was let use its extra CPU buffer types (CPU_EXTRA_BUFFERS, resolved),
    # and the CPU features the llama.cpp build was compiled with (llama_print_system_info)
    cpu_extra_buffers: bool = True
    system_info: str = ""
    # a CUDA build's driver, runtime, GPUs and problems (app.engine.cuda_check); None on a CPU build
    cuda: dict | None = None
    # the process's C++ runtime: whether libstdc++ was pinned first (app.base.cxx_runtime)
    cxx_runtime: dict | None = None
    vision: bool = False  # a projector (MMPROJ) is loaded that reads images
    audio_rate: int = 0  # ... that hears: the sample rate it takes (0: it reads no audio)
    merges_frames: bool = False  # ... that merges two adjacent video frames (Qwen2-VL and on)
    # KV cache types and size, micro-batch, tensor overrides and what they moved (llama_model)
    placement: dict | None = None
    # the memory estimate before the load, the budget, and what llama.cpp then allocated
    # (app.engine.memory_check): /props "memory"; None with MEMORY_CHECK=off
    memory: dict | None = None
    # LORA_ADAPTERS: (name, scale when chosen) by adapter index
    adapters: tuple[tuple[str, float], ...] = ()
    reranks: bool = False  # a reranker (pooling rank): /v1/rerank, /v2/rerank and /score

    @property
    def modalities(self) -> dict[str, bool]:
        """What the projector reads, as /props, /v1/models and /health say it."""
        return {"vision": self.vision, "audio": self.audio_rate > 0}

    @property
    def beyond_training(self) -> bool:
        """Whether a slot's context is longer than the model's training window (CTX_SIZE set
        past it: served, with a warning; llama-server caps the slot instead)."""
        return self.n_ctx > self.n_ctx_train > 0

    @property
    def names(self) -> tuple[str, ...]:
        """The names this model answers to: its aliases, or its id when it has none."""
        return self.aliases or (self.name,)


# llama.cpp's enum llama_vocab_type, by value (llama-server reports the number)
VOCAB_TYPES = ("none", "spm", "bpe", "wpm", "ugm", "rwkv", "plamo2")


class Handle(Protocol):
    """One submitted generation, as seen from the request's greenlet."""

    def __iter__(self) -> Iterator[Event]: ...

    @property
    def over(self) -> bool: ...

    def next_event(self, timeout: float | None = None) -> Event: ...

    def cancel(self) -> None: ...

    def inject(self, text: str, unless: str = "") -> None:
        """Insert ``text`` into the first choice's generation as if generated (to end a
        thought), unless the text generated by then already contains ``unless`` (the model
        closed the thought itself while the request was on its way)."""
        ...


class Engine(Protocol):
    """The narrow interface between HTTP and llama.cpp."""

    state: LoadState

    @property
    def info(self) -> ModelInfo | None: ...

    def submit(self, request: GenerationRequest) -> Handle:
        """Queue a generation; raises QueueFull or ModelNotReady at once."""
        ...

    def count_tokens(self, request: GenerationRequest) -> int:
        """How many tokens the request's prompt is, tokenized exactly as ``submit`` would.
        Any thread; raises the errors ``submit`` would for a prompt that cannot fit."""
        ...

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """The request's prompt as ``submit`` would tokenize it (protected spans as text);
        ``count_tokens`` is its length. Any thread but the engine's."""
        ...

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """``text`` as the model's tokens (``add_special``: BOS and the like, as the model
        wants; ``parse_special``: control-token text becomes control tokens). Any thread but
        the engine's: the tokenizer only reads the vocabulary."""
        ...

    def pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's bytes, control tokens spelled out (llama-server's pieces); a token id
        outside the vocabulary is a BadRequest. Any thread but the engine's."""
        ...

    def slots(self) -> list[dict[str, object]]:
        """Each slot's state as plain values, read without locking (a snapshot that may be a
        step old): id, is_processing, n_ctx, prompt, cached and generated token counts."""
        ...

    def slot_action(self, slot_id: int, action: str, filename: str | None) -> dict[str, object]:
        """llama-server's slot save, restore and erase (blocks: a native thread)."""
        ...

    def queue_depth(self) -> int: ...

    def stats(self) -> dict[str, object]:
        """For health and tests: slots running, requests waiting, steps decoded, and how many
        sequences each step sampled."""
        ...

    def stalled(self, limit: float) -> str | None:
        """Why the engine looks stuck (a step or a request's preparation running longer than
        ``limit`` seconds while work waits), or None."""
        ...

    def drain(self) -> None:
        """Refuse new requests; those in flight go on."""
        ...

    def abort(self, message: str) -> None:
        """End every request in flight now, with a shutting_down error."""
        ...

    def shutdown(self) -> None: ...


def slot_row(slot_id: int, n_ctx: int, n_kv: int = 0, *, job: bool = False, prompt: int = 0,
             processed: int = 0, cached: int = 0, decoded: int = 0, remain: int = 0,
             choice: int = 0) -> dict[str, object]:
    """One slot of GET /slots: llama-server's fields (id, n_ctx, is_processing, next_token)
    and the token counts of the request it runs. ``n_kv``: tokens its KV cache holds (for an
    idle slot, the prefix the next request may reuse)."""
    return {
        "id": slot_id,
        "n_ctx": n_ctx,
        "is_processing": job,
        "n_prompt_tokens": prompt,  # the running request's prompt
        "n_prompt_tokens_processed": processed,  # ... of it in the KV so far, reused included
        "n_prompt_tokens_cached": cached,  # ... of it reused from the slot's last request
        "n_decoded": decoded,  # tokens generated so far
        "n_kv": n_kv,
        "choice": choice,  # which of the request's n choices (0 for most)
        "next_token": {"has_next_token": job, "n_remain": remain, "n_decoded": decoded},
    }
