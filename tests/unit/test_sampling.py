"""Grammar-safe sampling against the real vocabulary (llama.cpp, vocab only; no decoding).

A token reaches a grammar's accept only after its apply allowed it: these drive the parts that
used to abort the process (a dead grammar, a lazy trigger followed by text the grammar refuses)
and check that each ends in an exception or a dropped grammar, in this very process.
"""

from __future__ import annotations

import pytest

from app import formats
from app.engine.sampling import GrammarDeadEnd, GrammarSpec, Sampler, Vocab, compile_grammar
from app.engine.types import SamplingParams
from app.grammar.gate import Limits
from app.protocol.tools import validate_tools
from app.settings import Settings

LIMITS = Limits.from_settings(Settings())


@pytest.fixture(scope="module")
def vocab(default_model):
    import llama_cpp
    from llama_cpp import llama_cpp as ll

    llama_cpp._logger.set_verbose(False)
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(str(default_model).encode(), params)
    yield Vocab(ll, ll.llama_model_get_vocab(model))
    ll.llama_model_free(model)


def sampler(vocab, text: str, triggers: tuple[str, ...] = ()) -> Sampler:
    ptr = compile_grammar(vocab, text)
    assert ptr is not None
    return Sampler(vocab, SamplingParams(grammar=text, grammar_triggers=triggers), 0, ptr,
                   GrammarSpec(text, triggers))


def test_vocab_tables(vocab):
    assert vocab.n > 40_000 and len(vocab.eog_ids) >= 1
    assert vocab.byte_token[ord("a")] >= 0 and "<|im_start|>" in vocab.control_texts


@pytest.mark.parametrize("text", [r"root ::= [^\x00-\U0010FFFF]", r'root ::= "\x00"'])
def test_a_grammar_that_admits_nothing_is_caught_before_any_accept(vocab, text):
    s = sampler(vocab, text)
    with pytest.raises(GrammarDeadEnd):
        s.probe()
    s.free()


def test_the_prefilter_finds_exactly_what_the_full_apply_finds(vocab):
    import numpy as np

    for text in ('root ::= "\\"" [a-z]+ "\\""', 'root ::= [0-9]+ | "true"', 'root ::= "é" [^a]'):
        s = sampler(vocab, text)
        fast = set(s.allowed(None)["id"].tolist())
        s.spec.prefilter = False
        full = set(s.allowed(None)["id"].tolist())
        assert fast == full and fast, text
        assert isinstance(s.allowed(np.zeros(vocab.n, dtype=np.float32)), np.ndarray)
        s.free()


def test_feeding_text_checks_every_byte(vocab):
    s = sampler(vocab, 'root ::= "ab" "c"')
    assert s.feed(b"ab")
    assert not s.feed(b"x")  # refused, not accepted: no abort
    s.free()


def test_a_lazy_tool_grammar_takes_hold_at_its_trigger_and_lets_go_of_a_malformed_call(vocab):
    tools = validate_tools([{"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}])
    text = formats.get("hermes").grammar(tools, parallel=False, limits=LIMITS)
    good = sampler(vocab, text, ("<tool_call>",))
    good.observe(b"Let me look. <tool_call>\n{\"na")
    assert good.armed and good.grammar is not None
    # what llama.cpp replayed into the grammar and aborted on: "<tool_call>{" with no newline
    bad = sampler(vocab, text, ("<tool_call>",))
    bad.observe(b"Sure <tool_call>{\"name\"")
    assert not bad.armed and bad.grammar is None  # dropped: the reply is read as text
    for s in (good, bad):
        s.free()
