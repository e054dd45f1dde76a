"""Strict request bodies (fast tier): what json.loads alone would let through."""

from __future__ import annotations

import json
import random

import pytest

from app.base.errors import BadRequest
from app.protocol import jsonbody


@pytest.mark.parametrize("raw, needle", [
    (b"", "empty"),
    (b"\xff", "UTF-8"),
    (b'{"a": "\xed\xa0\x80"}', "UTF-8"),  # a surrogate encoded as CESU-8 bytes
    (b'{"a": "\\ud800"}', "surrogate"),
    (b'{"a": "\\udc00\\ud800"}', "surrogate"),
    (b'{"a": NaN}', "NaN"),
    (b'{"a": -Infinity}', "Infinity"),
    (b'{"a": ' + b"1" * 5000 + b"}", "digits"),
    (b"[" * 65 + b"]" * 65, "65 levels"),
    (b"[" * 100_000 + b"]" * 100_000, "nests"),
    (b'{"a": "x"', "not valid JSON"),
])
def test_refused(raw, needle):
    with pytest.raises(BadRequest, match=needle):
        jsonbody.parse(raw, 64)


def test_accepted():
    assert jsonbody.parse(b'{"a": "\\ud83d\\ude00 \\\\ud800 [[[", "b": [[1]]}', 64) == {
        "a": "\U0001f600 \\ud800 [[[", "b": [[1]]}
    assert jsonbody.parse(b"[" * 64 + b"]" * 64, 64)


def test_lone_surrogate_agrees_with_python_on_random_escapes():
    rng = random.Random(3)
    parts = ["\\ud800", "\\udc00", "\\\\", "\\u0041", "a", "\\n", '\\"', "\\uD83D", "\\uDE00", "\\\\u"]
    for _ in range(5000):
        text = '"' + "".join(rng.choice(parts) for _ in range(rng.randint(0, 6))) + '"'
        value = json.loads(text)
        try:
            value.encode("utf-8")
            lone = False
        except UnicodeEncodeError:
            lone = True
        assert jsonbody.lone_surrogate(text) == lone, text


def test_depth_skips_strings():
    assert jsonbody.depth(b'{"a": "[[[[{{", "b": [{"c": "\\"]]"}]}') == 3
