"""Chat prompts rendered from the model's own Jinja template, in a sandbox.

We render templates ourselves (not through llama-cpp-python's chat handlers) so that tool calls,
reasoning and batching all build on one token stream that we control.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.base.errors import BadRequest
from app.engine.types import MEDIA, PROTECT_CLOSE, PROTECT_OPEN

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


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}``, transformers' mark of the assistant's own text
    (for training masks; LFM2.5's template has it): rendered as its body, as transformers and
    llama.cpp render it."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _Generation],
        undefined=jinja2.Undefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def clean(text: str) -> str:
    """Client text with the engine's image mark (MEDIA) replaced: only an image part makes one."""
    return text.replace(MEDIA, "\ufffd") if MEDIA in text else text


def flatten_content(content: Any, where: str,
                    image: Callable[[dict[str, Any], str], Any] | None = None) -> str:
    """OpenAI content (a string or a list of parts) as the plain text templates expect. An
    image part becomes a MEDIA mark, and ``image(part, param)`` takes the image (without it,
    an image part is refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return clean(content)
    texts: list[str] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(clean(str(part.get("text", ""))))
        elif kind in IMAGE_PARTS and image is not None:
            image(part, f"{where}.content.{i}")
            texts.append(MEDIA)
        else:
            raise BadRequest(
                f"content part of type {kind!r} is not supported by this server",
                param=f"{where}.content.{i}",
            )
    return "".join(texts)


# the media parts of OpenAI's Chat Completions (image_url, input_audio; video_url as vLLM
# takes it, input_video as llama-server does) and Responses (input_image)
IMAGE_PARTS = frozenset({"image_url", "input_image", "input_audio", "video_url", "input_video"})


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


# ---- message text stays text -------------------------------------------------------------------


def _trie_pattern(words: list[str]) -> str:
    """One regular expression matching any of ``words``, longest first, built as a trie (an
    alternation of thousands of literals, as Gemma's control tokens are, is slow in ``re``)."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = True

    def build(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + build(sub) for ch, sub in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(trie)


@lru_cache(maxsize=4)
def protector(control_texts: tuple[str, ...]) -> Callable[[Any], Any]:
    """A function that copies a request's data (strings, lists, dicts), marking every control
    token's text inside its strings so the engine tokenizes it as plain text. Noncharacters the
    markers use are replaced in the data, so a client cannot forge a marker."""
    words = [t for t in control_texts if len(t) >= 2]
    pattern = re.compile(_trie_pattern(words)) if words else None
    firsts = frozenset(t[0] for t in words)
    forged = re.compile(f"[{PROTECT_OPEN}{PROTECT_CLOSE}]")

    def text(s: str) -> str:
        if PROTECT_OPEN in s or PROTECT_CLOSE in s:
            s = forged.sub("\ufffd", s)
        if pattern is None or not any(c in s for c in firsts):
            return s
        return pattern.sub(lambda m: PROTECT_OPEN + m.group(0) + PROTECT_CLOSE, s)

    def protect(value: Any) -> Any:
        # iterative: request bodies are depth-limited, but no recursion is needed either
        root: list[Any] = [None]
        todo: list[tuple[Any, Any, Any]] = [(value, root, 0)]
        while todo:
            node, parent, key = todo.pop()
            if isinstance(node, str):
                parent[key] = text(node)
            elif isinstance(node, dict):
                copy: dict[Any, Any] = {}
                for k, v in node.items():
                    k2 = text(k) if isinstance(k, str) else k
                    copy[k2] = None
                    todo.append((v, copy, k2))
                parent[key] = copy
            elif isinstance(node, list):
                items: list[Any] = [None] * len(node)
                todo.extend((v, items, i) for i, v in enumerate(node))
                parent[key] = items
            else:
                parent[key] = node
        return root[0]

    return protect
