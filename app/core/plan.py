"""A ChatInput or TextInput becomes an engine request and a reply spec: the prompt (tools
offered the way the template expects, message text marked so it stays text), the grammar that
holds the model to a format, and how to read the reply. Pure CPU work, run off the request hub.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from typing import Any

from app import formats
from app.base.errors import BadRequest
from app.core import media
from app.core.input import ChatInput, OutputFormat, TextInput, ToolChoice, effort_for
from app.core.media import MediaLimits
from app.engine.types import MEDIA, Frames, GenerationRequest, Image, ModelInfo, SamplingParams
from app.formats import chat_template
from app.formats.spec import ReplySpec, Tool
from app.grammar import gate, json_schema
from app.protocol import tools

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanOptions:
    """The server's side of planning. Built from Settings by ``app.plan_options``: fields named
    like a setting are that setting, the others are derived from settings there. No defaults,
    so none can drift from the settings'."""

    reasoning_format: str
    tool_format: str  # a formats.FORMATS name, or auto
    limits: gate.Limits
    protect_messages: bool  # SPECIAL_TOKENS_IN_MESSAGES=text
    timeout: float | None  # REQUEST_TIMEOUT (None: no limit)
    slots_per_request: int  # SLOTS_PER_REQUEST, resolved
    strict_model_name: bool  # a request naming none of the model's names is a 404
    max_tokens_default: int | None  # a request naming no limit gets it (None: the context)
    max_tokens_limit: int  # MAX_TOKENS_LIMIT (0: none)
    max_tokens_clamp: bool  # MAX_TOKENS_CLAMP: too many asked for is a ceiling, not a 400
    default_temperature: float  # DEFAULT_TEMPERATURE and the like: for a request naming none
    default_top_p: float
    default_top_k: int
    default_min_p: float
    media: MediaLimits  # IMAGES_PER_REQUEST, IMAGE_MAX_BYTES, IMAGE_MAX_PIXELS, IMAGE_MAX_SIDE


@dataclass
class Plan:
    generation: GenerationRequest
    reply: ReplySpec | None = None  # how to parse the reply (None: it is plain text)
    reasoning_budget: int | None = None
    reasoning_control: bool = False
    model: str | None = None  # the name the answers carry (Service.model_name)
    video_frames: int = 0  # frames the request's videos gave (usage reports them)


def pick(offered: tuple[Tool, ...], choice: ToolChoice) -> tuple[list[Tool], bool]:
    """(the tools the model may call, whether it must call one)."""
    if choice.mode == "auto":
        return list(offered), False
    if choice.mode == "none":
        return [], False
    if choice.mode == "required":
        return list(offered), True
    chosen = [t for t in offered if t.name == choice.name]
    if not chosen:
        raise BadRequest(f"{choice.param} names {choice.name!r}, which is not in tools",
                         param=choice.param)
    return chosen, True


def output_grammar(output: OutputFormat | None, limits: gate.Limits) -> tuple[str, str] | None:
    """(grammar, the field it comes from) for structured output; None for free text."""
    if output is None:
        return None
    if output.kind == "json_object":
        return json_schema.json_object(), output.param
    if not isinstance(output.schema, dict):
        raise BadRequest(f"{output.param} must be a JSON Schema object", param=output.param)
    return json_schema.from_schema(output.schema, output.param, limits), output.param


def answer_schema(output: OutputFormat) -> dict[str, Any]:
    """The JSON Schema of an output format (json_object: any object), for a grammar that holds
    a text answer beside tool calls."""
    return {"type": "object"} if output.kind == "json_object" else output.schema


def plan_text(inp: TextInput, opts: PlanOptions) -> Plan:
    gen = GenerationRequest(inp.prompt, inp.params, timeout=opts.timeout,
                            cache_prompt=inp.cache_prompt, n=inp.n)
    return _checked(Plan(gen), opts)


def plan_chat(info: ModelInfo, inp: ChatInput, opts: PlanOptions) -> Plan:
    template = info.chat_template or ""
    limits = opts.limits
    fmt = formats.choose(opts.tool_format, template)
    params = inp.params
    protect = (chat_template.protector(info.control_texts) if opts.protect_messages
               else (lambda value: value))
    offered, required = pick(inp.tools, inp.tool_choice)
    thought, taught = formats.choose_reasoning(opts.reasoning_format, template)
    mode = opts.reasoning_format if opts.reasoning_format in formats.REASONING_MODES else "parsed"
    think = mode == "parsed" or (taught and (mode == "auto" or bool(offered)))
    formatted = output_grammar(inp.output, limits)  # checked under every tool_choice
    if formatted is not None and params.grammar is not None:
        raise BadRequest("grammar and a JSON output format cannot be combined",
                         param=formatted[1])
    if offered and params.grammar is not None:
        raise BadRequest("tools cannot be combined with a grammar", param=params.grammar_param)
    # Tools beside an output format (OpenAI and llama-server take both): tool_choice none
    # offers no tools, so the format holds the reply; a forced choice (required, a named tool)
    # leaves no text for a format to hold, so the call grammar alone does; under auto one
    # grammar holds both, the text to the format and the calls to the tools (``answer``).
    answer = None
    if formatted is not None:
        if not offered:
            params = replace(params, grammar=formatted[0], grammar_param=formatted[1])
        elif not required:
            assert inp.output is not None
            answer = answer_schema(inp.output)
    parallel = inp.parallel_tool_calls and inp.tool_choice.mode != "named"
    messages = fmt.history(protect(inp.messages))
    # an effort named, else the one a thought budget reaches (Anthropic's budget_tokens,
    # Gemini's thinkingBudget): a syntax whose template reads a level (GPT-OSS) gets one
    effort = inp.effort if inp.effort is not None else effort_for(inp.reasoning_budget)
    extra: dict[str, Any] = thought.controls(protect(dict(inp.template_kwargs)), effort,
                                             inp.thinking)
    if inp.reasoning_budget is not None:  # a template may read the budget (Seed-OSS)
        extra = thought.budgeted(extra, inp.reasoning_budget)
    if offered:
        messages, extra = fmt.offer(messages, extra, offered, required, protect)
        think = think and fmt.native  # the generic form's grammar holds the whole reply
    prompt = _render(info, messages, inp.add_generation_prompt, extra)
    if taught and inp.add_generation_prompt:
        prompt = thought.finish_prompt(prompt, inp.thinking)
    if inp.prefill:  # the answer's start, as message text: the reply continues it
        prompt += protect(inp.prefill)
    in_thought = think and thought.opened(prompt)
    parsed = offered  # the tools a reply is read for
    if offered and (required or answer is not None or not think or fmt.lazy_past_thoughts):
        # a grammar that holds the whole reply lets a thought come first; a lazy one (auto
        # without a format) takes hold only at a call, after any thought
        lead = ("open" if in_thought else "think" if think else "") if required or answer else ""
        # takes hold only once a call starts; with an answer format the grammar holds the
        # whole reply, so it cannot be lazy (see ToolFormat.grammar)
        triggers = fmt.lazy_triggers(offered)
        lazy = not required and answer is None and bool(triggers)
        try:
            call = fmt.grammar(offered, parallel=parallel, required=required, lead=lead,
                               template=template, limits=limits, thought=thought,
                               answer=answer)
            gate.check(call, "tools", limits)  # cached: _checked() checks it again
        except BadRequest:
            if not lazy and answer is None:
                raise
            call = None  # a lazy grammar the gate refuses: calls are left to the model
            log.warning("tool schemas cannot be turned into a grammar: calls are not held to them")
            if answer is not None and formatted is not None:
                # the format still holds the reply (the text the request asked for); no call
                # can be written then, so the reply is read as the answer alone
                params = replace(params, grammar=formatted[0], grammar_param=formatted[1])
                parsed = []
        if call is not None:
            params = replace(params, grammar=call, grammar_param="tools",
                             grammar_takes_injection=bool(lead),
                             grammar_triggers=triggers if lazy else ())
    spec = None
    reads = bool(parsed) or (fmt.reads_replies and not offered)  # no tools: no calls count
    if reads or think:
        spec = ReplySpec(
            format=fmt if reads else None,
            think=think,
            in_thought=in_thought,
            thought=thought,
            inline=mode == "inline",
            string_params={t.name: tools.string_params(t) for t in parsed},
            names=frozenset(t.name for t in parsed),
        )
    prompt, media_items, frames = _images(info, inp, prompt, opts.media)
    gen = GenerationRequest(prompt, params, timeout=opts.timeout, cache_prompt=inp.cache_prompt,
                            n=inp.n, media=media_items)
    return _checked(Plan(gen, spec, inp.reasoning_budget, inp.reasoning_control,
                         video_frames=frames), opts)


def _images(info: ModelInfo, inp: ChatInput, prompt: str, limits: MediaLimits
            ) -> tuple[str, tuple, int]:
    """The prompt, the request's images and sounds, decoded (app.core.media), each at its
    MEDIA mark in the prompt, and how many video frames are among them: a video's one mark
    becomes one per frame (or per merged pair of frames, _frame_groups)."""
    if not inp.media:
        return prompt, (), 0
    for item in inp.media:
        if item.kind == "video" and not info.vision:
            raise BadRequest("this model's projector sees no images, so it reads no video "
                             "(serve it with an MMPROJ that sees to send video)",
                             param=item.param, code="video_input_not_supported")
        if item.kind == "image" and not info.vision:
            raise BadRequest("this model has no vision projector: it reads no images (serve it "
                             "with an MMPROJ that sees to send them)", param=item.param,
                             code="image_input_not_supported")
        if item.kind == "audio" and not info.audio_rate:
            raise BadRequest("this model's projector hears no audio (serve it with an MMPROJ "
                             "that reads audio to send it)", param=item.param,
                             code="audio_input_not_supported")
    if inp.params.prompt_logprobs is not None:
        raise BadRequest("prompt log probabilities are not available for a prompt with images",
                         param="prompt_logprobs")
    if prompt.count(MEDIA) != len(inp.media):  # a template that drops or repeats a message
        raise BadRequest("the chat template did not keep each image in its place",
                         param=inp.media[0].param, code="invalid_image")
    decoded = media.decode_all(inp.media, limits, info.audio_rate)
    if not any(isinstance(d, tuple) for d in decoded):
        return prompt, decoded, 0
    pieces = prompt.split(MEDIA)
    out, items, frames = [pieces[0]], [], 0
    for d, after in zip(decoded, pieces[1:], strict=True):
        if isinstance(d, tuple):
            groups = _frame_groups(d) if info.merges_frames else d
            out.append(MEDIA * len(groups))
            items.extend(groups)
            frames += len(d)
        else:
            out.append(MEDIA)
            items.append(d)
        out.append(after)
    return "".join(out), tuple(items), frames


def _frame_groups(frames: tuple[Image, ...]) -> tuple[Image | Frames, ...]:
    """A video's frames in pairs, for a projector that merges two adjacent frames into one set
    of tokens (Qwen2-VL and its successors); an odd last frame stays an image."""
    out: list[Image | Frames] = []
    for i in range(0, len(frames) - 1, 2):
        pair = frames[i:i + 2]
        digest = hashlib.sha256(("frames:" + ":".join(f.digest for f in pair)).encode())
        out.append(Frames(pair, digest.hexdigest()))
    if len(frames) % 2:
        out.append(frames[-1])
    return tuple(out)


_MARK = "vertex-gguf opening 7f3a"


def opening(info: ModelInfo) -> str | None:
    """The text every chat that sends no system prompt starts with: the chat template over one
    user turn, up to that turn's words (for SmolLM2, its default system prompt and the user
    turn's header: 27 tokens). The engine decodes it at load, so the first requests find it in
    the KV cache as later ones do. None when the template cannot say it."""
    try:
        text = _render(info, [{"role": "user", "content": _MARK}], True, {})
    except BadRequest:
        return None
    cut = text.find(_MARK)
    return text[:cut] if cut > 0 else None


def _render(info: ModelInfo, messages: list[dict[str, Any]], add_generation_prompt: bool,
            extra: dict[str, Any]) -> str:
    """The chat template over ``messages``. A template that refuses a system turn anywhere but
    first (many raise "system message must be at the beginning") gets those turns folded into
    the next user turn (or the last one, after the conversation's end) instead of a 400: agents
    send such turns, and the words still reach the model where they were said."""
    def render(msgs: list[dict[str, Any]]) -> str:
        return chat_template.render(
            info.chat_template, msgs, bos_token=info.bos_token, eos_token=info.eos_token,
            add_generation_prompt=add_generation_prompt, extra=extra,
        )

    try:
        return render(messages)
    except chat_template.TemplateError:
        folded = fold_system_turns(messages)
        if folded is messages:
            raise
        log.info("the chat template refused a system turn mid-conversation: folded into a user "
                 "turn")
        return render(folded)


def fold_system_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every system turn but a leading one folded into the next user turn
    (before its text), or into the last user turn when none follows; the same list when there
    is none to fold."""
    if not any(m.get("role") == "system" for m in messages[1:]):
        return messages
    out: list[dict[str, Any]] = [messages[0]]
    waiting: list[str] = []
    for m in messages[1:]:
        if m.get("role") == "system":
            waiting.append(str(m.get("content") or ""))
        elif m.get("role") == "user" and waiting:
            out.append({**m, "content": "\n\n".join([*waiting, str(m.get("content") or "")])})
            waiting = []
        else:
            out.append(m)
    if waiting:
        last = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
        if last is None:
            out.append({"role": "user", "content": "\n\n".join(waiting)})
        else:
            out[last] = {**out[last], "content": "\n\n".join([str(out[last].get("content") or ""),
                                                                *waiting])}
    return out


def bounded(params: SamplingParams, opts: PlanOptions) -> SamplingParams:
    """The generation length, every API's request alike: a limit over MAX_TOKENS_LIMIT is a
    400 naming the request's own field (with MAX_TOKENS_CLAMP, a ceiling cut to the limit and
    to the context); a request naming none gets DEFAULT_MAX_TOKENS (else MAX_TOKENS_LIMIT;
    neither: to the end of the context)."""
    limit = opts.max_tokens_limit
    if params.max_tokens is None:
        default = opts.max_tokens_default
        return replace(params, max_tokens_default=default) if default else params
    if opts.max_tokens_clamp and params.max_tokens:
        # a ceiling: cut to the limit here, and to what the context has left by the engine (a
        # default, unlike a request's own max_tokens, is cut there instead of refused)
        ceiling = min(params.max_tokens, limit) if limit else params.max_tokens
        return replace(params, max_tokens=None, max_tokens_default=ceiling)
    if limit and params.max_tokens > limit:
        field = params.max_tokens_param
        raise BadRequest(
            f"{field} is {params.max_tokens}: this server generates at most {limit} tokens "
            f"per request (MAX_TOKENS_LIMIT); ask for {limit} or fewer",
            param=field, code="invalid_value",
        )
    return params


def sampling(params: SamplingParams, opts: PlanOptions) -> SamplingParams:
    """The server's sampling defaults in place of what the request left unset (None)."""
    unset = {name: getattr(opts, f"default_{name}")
             for name in ("temperature", "top_p", "top_k", "min_p")
             if getattr(params, name) is None}
    return replace(params, **unset) if unset else params


def _checked(plan: Plan, opts: PlanOptions) -> Plan:
    """Every request: n within SLOTS_PER_REQUEST, its length within the server's bounds, and
    its grammar through the gate."""
    if plan.generation.n > opts.slots_per_request:
        raise BadRequest(
            f"n={plan.generation.n}: one request may use at most {opts.slots_per_request} "
            "of the server's slots (SLOTS_PER_REQUEST), so others are served too",
            param="n",
        )
    params = sampling(bounded(plan.generation.params, opts), opts)
    if plan.reasoning_budget is not None and plan.reply is not None and plan.reply.think:
        # a thought budget ends the thought after the step that used it up, and a step that
        # keeps a draft emits several tokens: drafting would change where the thought ends
        params = replace(params, speculative=replace(params.speculative, n_max=0))
    if params is not plan.generation.params:
        plan.generation = replace(plan.generation, params=params)
    if params.grammar is not None:
        stats = gate.check(params.grammar, params.grammar_param, opts.limits)
        params = replace(params, grammar_prefilter=not stats.has_tokens)
        plan.generation = replace(plan.generation, params=params)
    return plan
