"""Every format's forced call is held to its tool's schema: each required parameter exactly once,
each value of its schema's type, nothing the schema does not name.

The engine's own Sampler runs under each format's forced-call grammar (tool_choice required)
with random logits (the model loaded vocab-only, as in test_json_grammar_property), and every
finished output is read back by the format's own reply scanner. A random model under Qwen3-Coder's
old grammar wrote ``<parameter=city>`` over and over until max_tokens, and elsewhere a call with
neither required key.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from app import formats
from app.formats.reply import parse_reply
from app.formats.spec import ReplySpec, string_params
from app.grammar import gate
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.sampling import (
    closers_of,
    grammar_sampler,
    sample_once,
    tag_paths,
    token_pieces,
)

LIMITS = gate.Limits.from_settings(Settings())
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "units": {"enum": ["c", "f"]},
        "detail": {"type": "object", "properties": {"hourly": {"type": "boolean"}},
                   "required": ["hourly"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = validate_tools([{"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}])
FORMATS = sorted(formats.FORMATS)
SAMPLES = 12
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def pieces(vocab) -> list[bytes]:
    return token_pieces(vocab)


def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key written twice: {keys}"
    return dict(pairs)


def spec_for(fmt: formats.ToolFormat) -> ReplySpec:
    return ReplySpec(format=fmt, string_params={"weather": string_params(SCHEMA)},
                     names=frozenset({"weather"}))


@pytest.mark.parametrize("name", FORMATS)
def test_a_forced_call_carries_each_required_parameter_once_with_its_type(vocab, pieces, name):
    fmt = formats.get(name)
    text = fmt.grammar(TOOLS, parallel=False, required=True, limits=LIMITS)
    gate.check(text, "tools", LIMITS)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    closers = closers_of(pieces, (b"}", b"]", b",", b"\n"))
    # a marker holding a quote ends a string as '"' does in JSON (Gemma 4's <|"|>): its first
    # tokens are favoured as a quote is, and it is written to its end once begun
    quotes = tuple(m.encode() for m in fmt.markers if '"' in m)
    if quotes:
        closers[0][tag_paths(pieces, quotes)[b""]] = True
    paths = tag_paths(pieces, tuple(m.encode() for m in fmt.markers if m.startswith("</")) + quotes)
    finished = 0
    for seed in range(SAMPLES):
        out = sample_once(vocab, pieces, closers, text, seed, MAX_TOKENS, paths)
        if out is None:
            continue  # cut by the bound: not a finished call
        finished += 1
        reply = parse_reply(out.decode("utf-8", "replace"), spec_for(fmt), [], final=True)
        assert len(reply.calls) == 1, (name, out)
        call = reply.calls[0]
        assert call.name == "weather" and call.complete, (name, out)
        args = json.loads(call.arguments, object_pairs_hook=no_repeats)
        errors = [e.message for e in validator.iter_errors(args)]
        assert not errors, (name, out, errors)
    # a quarter: closing tags that share a long prefix (GLM's </arg_key> and </arg_value>) send
    # a random walk down the wrong one half the time, so its string values end less often
    assert finished >= SAMPLES // 4, f"{name}: only {finished} of {SAMPLES} calls finished"


QWEN_OK = ("<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n"
           "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


@pytest.mark.parametrize("text, whole", [
    (QWEN_OK, True),
    # a required parameter missing: the function cannot close without it
    ("<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n</function>", False),
    # a parameter written twice
    ("<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=city>\n", False),
    # a value of the wrong type
    ("<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\nthree", False),
    # a parameter the schema does not name
    ("<tool_call>\n<function=weather>\n<parameter=country>\n", False),
])
def test_qwen3_coder_forced_call_refuses_what_its_schema_does(vocab, text, whole):
    grammar = formats.get("qwen3_coder").grammar(TOOLS, parallel=False, required=True,
                                                 limits=LIMITS)
    s = grammar_sampler(vocab, grammar)
    try:
        fed = s.feed(text.encode())
        assert fed == whole
        if whole:
            assert s.allows(int(vocab.eog_ids[0]))
    finally:
        s.free()
