"""Grammar-safe sampling against the real vocabulary (llama.cpp, vocab only; no decoding).

A token reaches a grammar's accept only after its apply allowed it: these drive the parts that
used to abort the process (a dead grammar, a lazy trigger followed by text the grammar refuses)
and check that each ends in an exception or a dropped grammar, in this very process.
"""

from __future__ import annotations

import pytest

from app import formats
from app.engine.sampling import GrammarDeadEnd, GrammarSpec, Sampler, compile_grammar
from app.engine.types import SamplingParams
from app.grammar.gate import Limits
from app.protocol.tools import validate_tools
from app.settings import Settings
from tests.support.sampling import OwnLogits

LIMITS = Limits.from_settings(Settings())


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


def test_a_later_step_over_the_budget_is_a_retryable_server_error(vocab):
    """The probe passed: a step that runs over later is not the caller's fault (503, retryable)."""
    from app.base.errors import BadRequest, Unavailable
    from app.engine.sampling import GrammarStepTooSlow
    from app.protocol.http_status import headers_of, status_of

    s = sampler(vocab, "root ::= [a-z]+")
    s.probe()
    s.ll = OwnLogits(vocab.ll, vocab.n)
    s.max_step_s = 0.0  # any CPU at all is over it
    with pytest.raises(GrammarStepTooSlow) as err:
        s.sample(None, 0)
    assert isinstance(err.value, Unavailable) and not isinstance(err.value, BadRequest)
    assert (status_of(err.value), headers_of(err.value)) == (503, {"Retry-After": "1"})
    assert err.value.code == "grammar_too_slow" and "GRAMMAR_MAX_STEP_MS" in err.value.message
    s.free()


def test_the_budget_counts_the_engine_threads_cpu_not_the_wall_clock(vocab):
    """50 ms of wall time inside a step (as when other processes hold the cores) against a 20 ms
    budget: the grammar's own work is far below it, so the step goes through."""
    s = sampler(vocab, "root ::= [a-z]+")
    s.probe()
    s.ll = OwnLogits(vocab.ll, vocab.n, nap=0.05)
    s.max_step_s = 0.02
    tok = s.sample(None, 0)
    assert ord("a") <= vocab.first_byte[tok] <= ord("z")  # and the grammar held it
    s.free()


def test_a_first_step_over_the_budget_is_the_grammars_own_cost(vocab):
    from app.engine.sampling import GrammarTooSlow

    s = sampler(vocab, "root ::= [a-z]+")
    s.max_step_s = 0.0
    with pytest.raises(GrammarTooSlow) as err:
        s.probe()
    assert err.value.code == "grammar_too_slow" and "CPU" in err.value.message
    s.free()


@pytest.mark.parametrize("name, call", [
    ("hermes", b'<tool_call>\n{"name": "get", "arguments": {"q": "x"}}\n</tool_call>'),
    ("generic", b'{"tool_calls": [{"name": "get", "arguments": {"q": "x"}}]}'),
])
def test_a_tool_grammar_beside_an_output_format_holds_the_answer_or_a_call(vocab, name, call):
    """tool_choice auto with a JSON output format: one grammar, not lazy, the text in the
    format's schema (the generic form's under "response") or a call."""
    tools = validate_tools([{"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}])
    answer = {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}
    text = formats.get(name).grammar(tools, parallel=False, required=False, limits=LIMITS,
                                     answer=answer)
    good = b'{"v": 3}' if name == "hermes" else b'{"response": {"v": 3}}'
    for reply in (good, call):
        s = sampler(vocab, text)
        assert s.feed(reply), reply
        s.free()
    for bad in (b"Sure", b'{"v": "three"}', b'{"response": "three"}'):
        s = sampler(vocab, text)
        assert not s.feed(bad), bad
        s.free()
