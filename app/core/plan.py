"""A ChatInput or TextInput becomes an engine request and a reply spec: the prompt (tools
offered the way the template expects, message text marked so it stays text), the grammar that
holds the model to a format, and how to read the reply. Pure CPU work, run off the request hub.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from app import grammar
from app.core.input import ChatInput, OutputFormat, TextInput, ToolChoice
from app.engine.types import GenerationRequest, ModelInfo
from app.errors import BadRequest
from app.protocol import chat_template, reasoning, replies, tools
from app.protocol.tools import Tool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanOptions:
    """The server's side of planning (from Settings)."""

    reasoning_format: str = "auto"
    tool_format: str = "auto"
    limits: grammar.Limits | None = None
    protect_messages: bool = True
    timeout: float | None = None
    slots_per_request: int = 1


@dataclass
class Plan:
    generation: GenerationRequest
    reply: replies.ReplySpec | None = None  # how to parse the reply (None: it is plain text)
    reasoning_budget: int | None = None
    reasoning_control: bool = False


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


def output_grammar(output: OutputFormat | None, limits: grammar.Limits) -> tuple[str, str] | None:
    """(grammar, the field it comes from) for structured output; None for free text."""
    if output is None:
        return None
    if output.kind == "json_object":
        return grammar.json_object(), output.param
    if not isinstance(output.schema, dict):
        raise BadRequest(f"{output.param} must be a JSON Schema object", param=output.param)
    return grammar.from_schema(output.schema, output.param, limits), output.param


def _limits(opts: PlanOptions) -> grammar.Limits:
    return opts.limits or grammar.Limits.defaults()


def plan_text(inp: TextInput, opts: PlanOptions) -> Plan:
    gen = GenerationRequest(inp.prompt, inp.params, timeout=opts.timeout,
                            cache_prompt=inp.cache_prompt, n=inp.n)
    return _checked(Plan(gen), opts)


def plan_chat(info: ModelInfo, inp: ChatInput, opts: PlanOptions) -> Plan:
    template = info.chat_template or ""
    limits = _limits(opts)
    fmt = replies.detect_format(template) if opts.tool_format == "auto" else opts.tool_format
    params = inp.params
    protect = (chat_template.protector(info.control_texts) if opts.protect_messages
               else (lambda value: value))
    offered, required = pick(inp.tools, inp.tool_choice)
    think = opts.reasoning_format == "parsed" or (
        reasoning.OPEN in template and (opts.reasoning_format == "auto" or bool(offered))
    )
    formatted = output_grammar(inp.output, limits)
    if formatted is not None:
        if params.grammar is not None:
            raise BadRequest("grammar and a JSON output format cannot be combined",
                             param=formatted[1])
        params = replace(params, grammar=formatted[0], grammar_param=formatted[1])
    if offered and params.grammar is not None:
        raise BadRequest("tools cannot be combined with a JSON output format or a grammar",
                         param=params.grammar_param)
    parallel = inp.parallel_tool_calls and inp.tool_choice.mode != "named"
    extra: dict[str, Any] = protect(dict(inp.template_kwargs))
    if fmt == "generic":
        messages = tools.render_history(protect(inp.messages))
        if offered:  # the generic form: described in words, held to JSON by a grammar
            think = False
            schema = tools.reply_schema(offered, required, parallel)
            params = replace(params, grammar=grammar.from_schema(schema, "tools", limits),
                             grammar_param="tools")
            messages = _with_system(messages, protect(tools.system_prompt(offered, required)))
    else:
        messages = tools.native_history(protect(inp.messages), fmt)
        if offered:
            extra["tools"] = protect(tools.template_tools(offered))
    prompt = chat_template.render(
        info.chat_template, messages, bos_token=info.bos_token, eos_token=info.eos_token,
        extra=extra,
    )
    in_thought = think and prompt.rstrip().endswith(reasoning.OPEN)
    if offered and fmt != "generic" and (required or not think):
        lead = ("open" if in_thought else "think" if think else "") if required else ""
        try:
            call = tools.call_grammar(fmt, offered, parallel=parallel, lead=lead,
                                      template=template, limits=limits)
            grammar.check(call, "tools", limits)  # cached: _checked() checks it again
        except BadRequest:
            if required:
                raise
            call = None  # auto: a schema the gate refuses is left to the model
            log.warning("tool schemas cannot be turned into a grammar: calls are not held to them")
        if call is not None:  # auto: the grammar takes hold only once a call starts
            params = replace(params, grammar=call, grammar_param="tools",
                             grammar_takes_injection=bool(lead),
                             grammar_triggers=() if required else tools.TRIGGERS[fmt])
    spec = None
    if offered or think:
        spec = replies.ReplySpec(
            tool_format=fmt if offered else None,
            think=think,
            in_thought=in_thought,
            inline=opts.reasoning_format == "inline",
            string_params={t.name: tools.string_params(t) for t in offered},
            names=frozenset(t.name for t in offered),
        )
    gen = GenerationRequest(prompt, params, timeout=opts.timeout, cache_prompt=inp.cache_prompt,
                            n=inp.n)
    return _checked(Plan(gen, spec, inp.reasoning_budget, inp.reasoning_control), opts)


def _checked(plan: Plan, opts: PlanOptions) -> Plan:
    """Every request: n within SLOTS_PER_REQUEST, and its grammar through the gate."""
    if plan.generation.n > opts.slots_per_request:
        raise BadRequest(
            f"n={plan.generation.n}: one request may use at most {opts.slots_per_request} "
            "of the server's slots (SLOTS_PER_REQUEST), so others are served too",
            param="n",
        )
    params = plan.generation.params
    if params.grammar is not None:
        stats = grammar.check(params.grammar, params.grammar_param, _limits(opts))
        params = replace(params, grammar_prefilter=not stats.has_tokens)
        plan.generation = replace(plan.generation, params=params)
    return plan


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Put the tool description into the system message (first), creating one if needed."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
