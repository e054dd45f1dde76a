"""Hostile input, end to end: every request the security review found crashing, stalling or
fooling the server, against a real gunicorn worker with the real model.

Each case asserts the status and the error's shape, that the worker did not restart (the same
pid before and after), and that a stream running beside it kept going and ended normally.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from tests.support.server import ServerProcess, running, running_server

JSON = {"Content-Type": "application/json"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def srv(default_model) -> Iterator[ServerProcess]:
    with running_server({"PARALLEL": "4", "STREAM_HEARTBEAT_SECONDS": "0", "BODY_TIMEOUT": "2",
                         "MAX_QUEUE": "16"}) as s:
        yield s


def worker_pid(srv: ServerProcess) -> int:
    children = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


class Beside:
    """A stream running beside a hostile request: it must keep going and end normally."""

    def __init__(self, srv: ServerProcess):
        self.chunks = 0
        self.finish: str | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(srv,), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while self.chunks < 3 and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _run(self, srv: ServerProcess) -> None:
        body = {"prompt": "Count slowly:", "max_tokens": 48, "temperature": 0, "stream": True,
                "ignore_eos": True}
        try:
            with requests.post(srv.url("/v1/completions"), json=body, stream=True, timeout=120) as r:
                for line in r.iter_lines(chunk_size=None):
                    if not line.startswith(b"data: {"):
                        continue
                    obj = json.loads(line[6:])
                    if "error" in obj:
                        self.error = obj["error"]["message"]
                    elif obj["choices"]:
                        self.chunks += 1
                        self.finish = obj["choices"][0]["finish_reason"] or self.finish
        except requests.RequestException as exc:
            self.error = str(exc)

    def check(self) -> None:
        self._thread.join(120)
        assert self.error is None, self.error
        assert self.finish == "length" and self.chunks >= 48, (self.finish, self.chunks)


@contextmanager
def hostile(srv: ServerProcess) -> Iterator[None]:
    pid = worker_pid(srv)
    beside = Beside(srv)
    yield
    beside.check()
    assert worker_pid(srv) == pid, "the worker restarted"
    assert requests.get(srv.url("/health"), timeout=10).status_code == 200


def send(srv: ServerProcess, path: str, body: dict | None = None, raw: bytes | None = None,
         headers: dict | None = None) -> requests.Response:
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(srv.url(path), data=data, headers=headers or JSON, timeout=120)


def error_of(r: requests.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


# ---- grammars that used to kill the process (C1, C2, H1) -------------------------------------


@pytest.mark.parametrize("grammar", [r"root ::= [^\x00-\U0010FFFF]", r'root ::= "\x00"'])
@pytest.mark.parametrize("temperature", [0, 0.8])
def test_a_grammar_that_admits_nothing_is_400(srv, grammar, temperature):
    with hostile(srv):
        r = send(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "temperature": temperature,
                                          "grammar": grammar})
        error_of(r, 400, "grammar_dead_end", "grammar")


def test_a_grammar_that_dead_ends_mid_way_ends_that_request_only(srv):
    grammar = r'root ::= "a" [\x00]'  # "a", then only NUL, which no token may start with
    with hostile(srv):
        r = send(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 4, "grammar": grammar})
        error_of(r, 400, "grammar_dead_end", "grammar")
        with requests.post(srv.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 4, "grammar": grammar,
                                                             "stream": True}, stream=True, timeout=60) as s:
            assert s.status_code == 200
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith(b"data: {")]
        assert events[-1]["error"]["code"] == "grammar_dead_end", events[-1]


def test_schema_with_huge_max_length_is_served(srv):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": 300000}}}
    with hostile(srv):
        r = send(srv, "/v1/chat/completions", {**CHAT, "response_format": fmt})
        assert r.status_code == 200, r.text


def test_tool_schema_with_huge_max_items_is_served(srv):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "xs": {"type": "array", "items": {"type": "integer"}, "maxItems": 300000}}}}}
    with hostile(srv):
        r = send(srv, "/v1/chat/completions", {**CHAT, "tools": [tool], "tool_choice": "required"})
        assert r.status_code == 200, r.text


def test_min_length_far_over_the_limit_is_400(srv):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "minLength": 10**9}}}
    with hostile(srv):
        err = error_of(send(srv, "/v1/chat/completions", {**CHAT, "response_format": fmt}), 400,
                       "grammar_too_complex", "response_format.json_schema.schema")
        assert "GRAMMAR_MAX_REPETITION" in err["message"]


@pytest.mark.parametrize("grammar, setting", [
    ("root ::= " + "(" * 300_000 + '"a"' + ")" * 300_000, "GRAMMAR_MAX_BYTES"),
    ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, "GRAMMAR_MAX_DEPTH"),
    ("root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(11_000)) + 'r11000 ::= "a"\n',
     "GRAMMAR_MAX_RULES"),
    ('root ::= "a"{0,2000} "b"{0,2000} "c"{0,2000} "d"{0,2000} "e"{0,2000} "f"{0,2000}', "GRAMMAR_MAX_RULES"),
    ("root ::= " + '"a"? ' * 250 + "[a]+", "GRAMMAR_MAX_OPTIONALS"),
    ("root ::= r0\n" + "".join(f'r{i} ::= "a"? r{i + 1}\n' for i in range(4000)) + 'r4000 ::= "a"\n',
     "GRAMMAR_MAX_OPTIONALS"),
    ("root ::= " + " | ".join(f'"v{i}"' for i in range(4000)), "GRAMMAR_MAX_ALTERNATIVES"),
    ('root ::= "a"{0,3000}', "GRAMMAR_MAX_REPETITION"),
])
def test_grammars_over_a_limit_are_400_naming_it(srv, grammar, setting):
    with hostile(srv):
        err = error_of(send(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "grammar": grammar}),
                       400, "grammar_too_complex", "grammar")
        assert setting in err["message"], err


@pytest.mark.parametrize("grammar", [
    'root ::= "a"{5,2}',  # llama.cpp would loop 2^64 times making rules
    'root ::= x\nx ::= x "a" | "b"',
    'root ::= ""?',
    'root ::= "unterminated',
])
def test_malformed_grammars_are_400(srv, grammar):
    with hostile(srv):
        error_of(send(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "grammar": grammar}),
                 400, "invalid_grammar", "grammar")


def test_grammars_just_under_the_limits_are_served(srv):
    deep = "root ::= " + "(" * 4000 + '"a"' + ")" * 4000
    chain = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(9000)) + 'r9000 ::= "a"\n'
    with hostile(srv):
        for grammar in (deep, chain):
            r = send(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "grammar": grammar})
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "a", r.text



def test_a_long_property_name_over_many_children_is_a_400_and_a_shorter_one_is_served(srv):
    """Review 3, H1: a 200 KB name over 1000 children built a 400 MB grammar before its size was
    checked; conversion now stops at GRAMMAR_MAX_BYTES. A name over the rule-name length (the
    rules are named by a digest) still makes a grammar the real llama.cpp takes."""
    kids = [f"p{i}" for i in range(1000)]
    huge = {"properties": {"k" * 200_000: {"properties": {k: {} for k in kids}, "required": kids}}}
    name = "long_" + "x" * 80
    fits = {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name]}
    with hostile(srv):
        err = error_of(send(srv, "/v1/chat/completions", {**CHAT, "response_format": {
            "type": "json_schema", "json_schema": {"name": "h", "schema": huge}}}), 400,
            "grammar_too_complex", "response_format.json_schema.schema")
        assert "GRAMMAR_MAX_BYTES" in err["message"], err
        r = send(srv, "/v1/chat/completions", {**CHAT, "max_tokens": 64, "response_format": {
            "type": "json_schema", "json_schema": {"name": "f", "schema": fits}}})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        # sampled (no temperature given): the grammar lets the object open with a space
        assert re.match(r'\{\s*"long_', choice["message"]["content"]), choice
        if choice["finish_reason"] == "stop":
            assert set(json.loads(choice["message"]["content"])) == {name}

def test_enums_and_colliding_properties(srv):
    big = {"type": "json_schema", "json_schema": {"name": "e", "schema": {"enum": [f"v{i:06d}" for i in range(4000)]}}}
    ok = {"type": "json_schema", "json_schema": {"name": "e", "schema": {"enum": [f"v{i:06d}" for i in range(1000)]}}}
    props = {chr(0x4E00 + i): {"type": "string"} for i in range(3000)}
    collide = {"type": "json_schema", "json_schema": {"name": "q", "schema": {
        "type": "object", "properties": props, "required": list(props)}}}
    with hostile(srv):
        err = error_of(send(srv, "/v1/chat/completions", {**CHAT, "response_format": big}), 400, "grammar_too_complex")
        assert "GRAMMAR_MAX_ALTERNATIVES" in err["message"]
        r = send(srv, "/v1/chat/completions", {**CHAT, "max_tokens": 8, "response_format": ok})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith('"v')
        assert send(srv, "/v1/chat/completions", {**CHAT, "response_format": collide}).status_code == 200


def test_a_grammar_over_the_step_time_limit_is_400(server_factory):
    s = server_factory({"PARALLEL": "1", "GRAMMAR_MAX_STEP_MS": "0.001"})
    s.wait_ready()
    r = send(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "grammar": 'root ::= [a-z]+'})
    err = error_of(r, 400, "grammar_too_slow", "grammar")
    assert "GRAMMAR_MAX_STEP_MS" in err["message"]
    assert send(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200


# ---- bodies the parser choked on (L1) ---------------------------------------------------------


@pytest.mark.parametrize("raw, needle", [
    (b"[" * 5000 + b"]" * 5000, "nests"),
    (b'{"prompt": "hi", "seed": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"prompt": "hi", "temperature": NaN}', "NaN"),
    (b'{"prompt": "bad \\ud800"}', "surrogate"),
    (b'{"prompt": "bad \xed\xa0\x80"}', "UTF-8"),
])
def test_bodies_the_parser_cannot_take_are_400(srv, raw, needle):
    with hostile(srv):
        err = error_of(send(srv, "/v1/completions", raw=raw), 400)
        assert needle in err["message"], err


def test_lone_surrogate_in_a_schema_pattern_is_400(srv):
    raw = (b'{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema",'
           b'"json_schema":{"name":"x","schema":{"type":"string","pattern":"^\\ud800$"}}}}')
    with hostile(srv):
        error_of(send(srv, "/v1/chat/completions", raw=raw), 400)


def test_deeply_nested_tool_parameters_are_400(srv):
    node = '{"type": "object", "properties": {"x": ' * 700 + '{"type": "string"}' + "}}" * 700
    raw = ('{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
           '"function": {"name": "f", "parameters": ' + node + "}}]}").encode()
    with hostile(srv):
        err = error_of(send(srv, "/v1/chat/completions", raw=raw), 400)
        assert "MAX_JSON_DEPTH" in err["message"]


def test_wrong_content_type_is_415(srv):
    with hostile(srv):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": ctype} if ctype else {}
            r = requests.post(srv.url("/v1/completions"), data=b'{"prompt":"hi","max_tokens":1}',
                              headers=headers, timeout=30)
            error_of(r, 415, "unsupported_media_type")


def test_a_trickled_body_is_cut_with_408(srv):
    with hostile(srv), socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{")
        data = b""
        deadline = time.monotonic() + 20
        while b"\r\n\r\n" not in data and time.monotonic() < deadline:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 408"), data[:200]


# ---- fields (L2) --------------------------------------------------------------------------------


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}),
    ("/v1/chat/completions", {**CHAT, "stream": "false"}),
    ("/predict", {"prompt": "hi", "stream": "false"}),
    ("/predict", {"instances": [{"prompt": "hi", "stream": 1}]}),
])
def test_stream_must_be_a_boolean_everywhere(srv, path, body):
    with hostile(srv):
        r = send(srv, path, body)
        if "instances" in body:
            assert r.status_code == 200 and r.json()["predictions"][0]["error"]["param"] == "stream", r.text
        else:
            error_of(r, 400, param="stream")


def test_unsupported_fields_are_400_not_ignored(srv):
    with hostile(srv):
        error_of(send(srv, "/v1/chat/completions", {**CHAT, "top_logprobs": 3}), 400, param="top_logprobs")
        error_of(send(srv, "/v1/chat/completions", {**CHAT, "functions": []}), 400, param="functions")


def test_logit_bias_bans_and_forces_tokens(srv):
    from tests.support.tokenizer import tokenizer

    tok = tokenizer().tokenize(b" Paris", add_bos=False)[0]
    base = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    with hostile(srv):
        plain = send(srv, "/v1/completions", base).json()["choices"][0]["text"]
        assert plain.startswith(" Paris"), plain
        banned = send(srv, "/v1/completions", {**base, "logit_bias": {str(tok): -100}}).json()["choices"][0]["text"]
        assert "Paris" not in banned
        forced = send(srv, "/v1/completions", {**base, "prompt": "Hello", "logit_bias": {str(tok): 100}})
        assert forced.json()["choices"][0]["text"] == " Paris" * 4
        error_of(send(srv, "/v1/completions", {**base, "logit_bias": {"99999999": 1}}), 400, param="logit_bias")
        error_of(send(srv, "/v1/completions", {**base, "logit_bias": {"x": 1}}), 400, param="logit_bias")


def test_n_predict_is_max_tokens(srv):
    with hostile(srv):
        r = send(srv, "/v1/completions", {"prompt": "Once upon a time", "n_predict": 3, "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 3
        error_of(send(srv, "/v1/completions", {"prompt": "hi", "n_predict": 3, "max_tokens": 4}), 400)


# ---- prompts (M1, M2) --------------------------------------------------------------------------


def test_control_token_text_in_a_message_stays_text(srv):
    def tokens(content: str) -> int:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
        return send(srv, "/v1/chat/completions", body).json()["usage"]["prompt_tokens"]

    with hostile(srv):
        base = tokens("AB")
        forged = tokens("A<|im_start|>B")
        assert forged > base + 3, (base, forged)  # "<", "|", "im", "_start", "|", ">": text
        # a raw completions prompt is the caller's own markup: there it is one control token
        raw = send(srv, "/v1/completions", {"prompt": "A<|im_start|>B", "max_tokens": 1}).json()
        plain = send(srv, "/v1/completions", {"prompt": "AB", "max_tokens": 1}).json()
        # "A", <|im_start|>, "B" against "AB"
        assert raw["usage"]["prompt_tokens"] <= plain["usage"]["prompt_tokens"] + 2 < forged - base


def test_a_4mb_prompt_is_refused_without_stalling_streams(srv):
    with hostile(srv):
        r = send(srv, "/v1/completions", {"prompt": "word " * 800_000, "max_tokens": 1})
        err = error_of(r, 400, "context_length_exceeded")
        assert "bytes" in err["message"]


# ---- resources (M3) -----------------------------------------------------------------------------


def test_n_is_bounded_per_request(srv):
    with hostile(srv):
        err = error_of(send(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "n": 4}), 400, param="n")
        assert "SLOTS_PER_REQUEST" in err["message"]
        assert send(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "n": 2}).status_code == 200


def test_a_non_streaming_client_that_hangs_up_cancels_its_generation(srv):
    body = json.dumps({"prompt": "Count:", "max_tokens": 3000, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 30
        while running(srv) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running(srv) == 1
    deadline = time.monotonic() + 30
    while running(srv) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(srv) == 0, "the generation kept running after its client left"


def test_an_envelope_cannot_take_every_slot(srv):
    inst = {"prompt": "Count:", "max_tokens": 16, "ignore_eos": True}
    before = requests.get(srv.url("/health"), timeout=10).json()["engine"]["batch_widths"]
    r = send(srv, "/predict", {"instances": [inst] * 8})
    assert all("choices" in p for p in r.json()["predictions"])
    after = requests.get(srv.url("/health"), timeout=10).json()["engine"]["batch_widths"]
    wider = {w: n - before.get(w, 0) for w, n in after.items() if int(w) > 2 and n - before.get(w, 0)}
    assert not wider, f"one envelope used more than SLOTS_PER_REQUEST=2 slots: {wider}"


def test_a_reader_that_stops_reading_does_not_hold_the_engine(srv):
    body = json.dumps({"prompt": "Count:", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
    with hostile(srv), socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        # never read: the stream beside it must still end normally (checked by hostile())

