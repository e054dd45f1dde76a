"""Chat prompts rendered from the model's own Jinja template, in a sandbox.

We render templates ourselves (not through llama-cpp-python's chat handlers) so that tool calls,
reasoning and batching all build on one token stream that we control.
"""

from __future__ import annotations

import datetime as _dt
import json
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.errors import BadRequest

# What llama.cpp falls back to when a GGUF carries no template.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TemplateError(BadRequest):
    code = "chat_template_error"


def _raise(message: str) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return _dt.datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols"],
        undefined=jinja2.Undefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def flatten_content(content: Any, where: str) -> str:
    """OpenAI content (a string or a list of parts) as the plain text templates expect."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(str(part.get("text", "")))
        else:
            raise BadRequest(
                f"content part of type {kind!r} is not supported by this model (text only)",
                param=f"{where}.content.{i}",
            )
    return "".join(texts)


def render(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    extra: dict[str, Any] | None = None,
) -> str:
    """The prompt text for ``messages``; template errors become 400s."""
    try:
        tmpl = _compile(template or CHATML)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not compile: {exc}") from exc
    try:
        return tmpl.render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            **(extra or {}),
        )
    except TemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise TemplateError(f"chat template failed: {exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise TemplateError(f"chat template failed: {exc}") from exc
