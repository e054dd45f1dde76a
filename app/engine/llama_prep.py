"""Preparing a request before the engine thread sees it: tokenize the prompt, check it against
the context, and build each choice's sampler (its grammar compiled and probed).

Runs on the engine's prep threads (native, with a large stack: llama.cpp's grammar parser
recurses). It only reads the vocabulary and the model's sizes, so it runs beside
``llama_decode``; nothing here touches what the engine thread owns.
"""

from __future__ import annotations

from app.base.errors import BadRequest, ContextOverflow
from app.engine.llama_media import ImageSpan
from app.engine.llama_model import LlamaModel
from app.engine.prediction import Place, Prediction
from app.engine.sampling import GrammarSpec, Sampler, compile_grammar, sized
from app.engine.slots import Job
from app.engine.text import TextAssembler
from app.engine.types import MEDIA, GenerationRequest, SamplingParams, outside_vocab


class Preparer:
    """Prepares jobs against one loaded model (a reload after sleep makes a new one)."""

    def __init__(self, model: LlamaModel, grammar_max_step_s: float, score_max_tokens: int):
        self._m = model
        self._limit = grammar_max_step_s
        self._score_max = score_max_tokens  # PROMPT_LOGPROBS_MAX_TOKENS

    def prompt_tokens(self, req: GenerationRequest) -> list[int]:
        """The prompt's tokens, refused (ContextOverflow, BadRequest) if it cannot be one."""
        m = self._m
        if isinstance(req.prompt, str):
            self._check_size(req)
            if req.media:  # counted (count_tokens): the spans are not kept
                tokens, spans = self._with_images(req)
                for span in spans:
                    m.projector.free_span(span)
                return tokens
            return m.tok.prompt(req.prompt, add_bos=req.add_bos and m.tok.add_bos)
        if len(req.prompt) >= m.n_ctx:
            raise ContextOverflow(
                f"prompt has {len(req.prompt)} tokens, but the context holds {m.n_ctx} "
                "tokens (and at least one must be left to generate)",
                param="prompt", tokens=len(req.prompt), limit=m.n_ctx,
            )
        bad = outside_vocab(req.prompt, m.n_vocab)
        if bad is not None:
            raise BadRequest(f"prompt token id {bad} is out of range", param="prompt")
        return list(req.prompt)

    def _check_size(self, req: GenerationRequest) -> None:
        """A text prompt too long in bytes to fit the context is refused before tokenizing."""
        assert isinstance(req.prompt, str)
        self._check_bytes(req.prompt, "prompt", "messages", ContextOverflow)

    def _check_bytes(self, text: str, what: str, param: str, error: type[BadRequest]) -> None:
        """``text`` (the prompt, a prediction) refused with ``error`` when it is more bytes
        than the context could hold in tokens."""
        m = self._m
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > m.max_prompt_bytes:
            raise error(f"{what} is {size} bytes: over {m.max_prompt_bytes} bytes it cannot "
                        f"fit the context of {m.n_ctx} tokens", param=param)

    def _with_images(self, req: GenerationRequest) -> tuple[list[int], list[ImageSpan]]:
        """A prompt with images: the text between MEDIA marks tokenized as any prompt is, each
        image's tokens from the projector (encoded here, off the engine thread)."""
        m = self._m
        if m.projector is None:
            raise BadRequest("this model has no vision projector: it reads text only (serve it "
                             "with MMPROJ to send images)", code="image_input_not_supported")
        assert isinstance(req.prompt, str)
        pieces = req.prompt.split(MEDIA)
        if len(pieces) != len(req.media) + 1:
            raise BadRequest("the prompt does not hold each image in its place",
                             code="invalid_image")
        tokens: list[int] = []
        spans: list[ImageSpan] = []
        try:
            for i, piece in enumerate(pieces):
                if piece:
                    tokens += m.tok.prompt(piece, add_bos=i == 0 and req.add_bos and m.tok.add_bos)
                if i < len(req.media):
                    toks, new = m.projector.image_tokens(req.media[i], len(tokens),
                                                         req.cache_scope)
                    tokens += toks
                    spans += new
        except BaseException:
            for span in spans:
                m.projector.free_span(span)
            raise
        if not tokens or tokens[-1] < 0:  # the first reply token is sampled from a text token
            for span in spans:
                m.projector.free_span(span)
            raise BadRequest("a prompt cannot end with an image", code="invalid_image")
        return tokens, spans

    def prepare(self, job: Job, warming: bool = False) -> None:
        """Tokenize, check against the context, build every choice's sampler. ``warming``: the
        engine's own warm-up, whose tiny grammar has no step limit (it must not fail a load)."""
        m = self._m
        req = job.request
        params = req.params
        if req.media:
            self._check_size(req)
            job.tokens, job.images = self._with_images(req)
        else:
            job.tokens = self.prompt_tokens(req)
        n_prompt = len(job.tokens)
        if n_prompt == 0:
            raise BadRequest("prompt is empty", param="prompt")
        if n_prompt >= m.n_ctx:
            raise ContextOverflow(
                f"prompt has {n_prompt} tokens, but the context holds {m.n_ctx} tokens "
                "(and at least one must be left to generate)",
                param="messages", tokens=n_prompt, limit=m.n_ctx,
            )
        max_tokens = params.max_tokens
        if max_tokens is not None and n_prompt + max_tokens > m.n_ctx:
            raise ContextOverflow(
                f"prompt ({n_prompt} tokens) plus {params.max_tokens_param} ({max_tokens}) exceeds the "
                f"context of {m.n_ctx} tokens",
                param=params.max_tokens_param, tokens=n_prompt, limit=m.n_ctx,
                requested=max_tokens,
            )
        if params.prompt_logprobs is not None and n_prompt > self._score_max:
            raise BadRequest(
                f"prompt has {n_prompt} tokens: this server scores prompts of at most "
                f"{self._score_max} tokens (PROMPT_LOGPROBS_MAX_TOKENS); send a shorter one, "
                "or ask without echo",
                param="echo", code="prompt_too_long_to_score",
            )
        bad_bias = outside_vocab((t for t, _ in params.logit_bias), m.n_vocab)
        if bad_bias is not None:
            raise BadRequest(
                f"logit_bias: token id {bad_bias} is not in the vocabulary (0..{m.n_vocab - 1})",
                param="logit_bias",
            )
        if max_tokens is not None:
            job.max_new = max_tokens
        else:  # to the end of the context, or the server's default when it comes first
            job.max_new = min(m.n_ctx - n_prompt, params.max_tokens_default or m.n_ctx)
        prediction = self._prediction(params.speculative.prediction)
        limit = float("inf") if warming else self._limit
        chain = sized(params, m.n_ctx, m.n_vocab)  # no field sizes native work past the model
        try:
            for j in (job, *job.followers):
                j.tokens = job.tokens
                j.max_new = job.max_new
                j.prediction = None if prediction is None else Place(prediction)  # its own place
                j.assembler = TextAssembler(params.stop)
                j.sampler = self._sampler(chain, j.index, probe=j is job, limit=limit)
        except BaseException:
            for j in (job, *job.followers):
                if j.sampler is not None:
                    j.sampler.free()
                    j.sampler = None
            raise

    def _prediction(self, text: str) -> Prediction | None:
        """Predicted Outputs: the prediction's tokens, as plain text (a special token's text in
        it is text), at most a context's worth, indexed; None without one. Over the prompt's
        byte limit it is refused: it could not all be used."""
        if not text:
            return None
        self._check_bytes(text, "prediction", "prediction", BadRequest)
        m = self._m
        return Prediction(m.tok.tokens(text, add_bos=False, special=False)[: m.n_ctx])

    def _sampler(self, p: SamplingParams, index: int, probe: bool, limit: float) -> Sampler:
        """A choice's sampler; with a grammar, compiled here and, for the first choice, probed
        (see Sampler.probe)."""
        vocab = self._m.vocab_tables
        if p.grammar is None:
            return Sampler(vocab, p, index, max_step_s=limit)
        spec = GrammarSpec(
            p.grammar, p.grammar_triggers, p.grammar_takes_injection, p.grammar_prefilter,
            p.grammar_param,
        )
        grammar = compile_grammar(vocab, p.grammar)
        if grammar is None:
            raise BadRequest(f"{p.grammar_param}: the grammar does not parse",
                             param=p.grammar_param, code="invalid_grammar")
        sampler = Sampler(vocab, p, index, grammar, spec, max_step_s=limit)
        if probe:
            try:
                sampler.probe()
            except BaseException:
                sampler.free()
                raise
        return sampler
