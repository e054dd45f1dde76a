"""The partial JSON reader resuming unfinished scans (app.formats.memo.resuming): at
every prefix of a growing text, in pieces of every size, what a resumed scan says is what a
scan from the start says; a kept scan is not used for a text that does not extend it."""

from __future__ import annotations

import json
import random

import pytest

from app.formats.memo import resuming
from app.formats.partial_json import Incomplete, call_object, string, value_end

ARGS = {"path": "src/a \"quoted\" file.py", "content": "line one\nline\ttwo \\ back\\slash é ☃ 𝄞 \ud800x"
        " end", "list": [1, 2.5, True, None, {"deep": ["x", {"y": "z"}]}], "empty": {}}
CALL = '{"name": "write_file", "arguments": ' + json.dumps(ARGS) + "}"
ESCAPED = '{"name": "write_file", "arguments": ' + json.dumps(ARGS, ensure_ascii=True) + "}"


def reads(text: str) -> tuple:
    """What the reader says of ``text``: the call so far, the arguments' scan, the name's."""
    out = [call_object(text, 0)]
    start = text.find('"arguments"')
    out.append(value_end(text, start + len('"arguments":')) if start != -1 else None)
    try:
        out.append(string(text, 9))
    except (Incomplete, ValueError) as exc:
        out.append(type(exc))
    return tuple(out)


@pytest.mark.parametrize("text", [CALL, ESCAPED], ids=["utf8", "escaped"])
@pytest.mark.parametrize("seed", range(6))
def test_a_resumed_scan_says_what_a_fresh_one_says(text, seed):
    rng = random.Random(seed)
    memo: dict = {}
    n = 0
    while n < len(text):
        n = min(len(text), n + rng.choice([1, 1, 2, 3, 7, 20]))
        prefix = text[:n]
        with resuming(memo):
            resumed = reads(prefix)
        assert resumed == reads(prefix), prefix
    assert memo  # something was kept along the way


def test_a_kept_scan_is_not_used_for_a_text_that_does_not_extend_it():
    memo: dict = {}
    with resuming(memo):
        assert value_end('{"a": "xxx', 0) == (10, False)  # kept: inside a string, depth 1
        assert value_end('{"b": 1} trailing', 0) == (8, True)  # another text: scanned afresh
        assert value_end('{"a": "xxx", "c": 2}', 0) == (20, True)  # the same one, grown
