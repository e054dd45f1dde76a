"""Operations, fast tier (Flask test client over the fake engine): API keys on every kind of
route, the key's cache scope, request ids, JSON log lines for Cloud Logging, trace parsing."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from app import create_app
from app.base import bridge, reqctx
from app.edge import auth, logs
from app.engine.fake import FakeEngine
from app.settings import Settings, api_key_configured, log_json, slots_endpoint_on
from tests.support.app import make_client

KEYS = "key-one,key-two"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGES = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
PREDICT = {"instances": [{"@requestFormat": "chatCompletions", **CHAT}]}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def keyed(engine):
    return make_client(engine, api_key=KEYS)


# ---- API keys --------------------------------------------------------------------------------

ROUTES = [  # (method, path, body): one of each kind of route
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 4}),
    ("POST", "/v1/messages", MESSAGES),
    ("POST", "/v1/messages/count_tokens", MESSAGES),
    ("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 16}),
    ("POST", "/v1/embeddings", {"input": "hi"}),
    ("POST", "/predict", PREDICT),
    ("POST", "/v1/chat/completions/control", {"id": "chatcmpl-x", "action": "reasoning_end"}),
    ("POST", "/tokenize", {"content": "hi"}),
    ("GET", "/v1/models", None),
    ("GET", "/props", None),
    ("GET", "/slots", None),
    ("GET", "/models/sse", None),
    ("GET", "/metrics", None),
    ("GET", "/no/such/route", None),
]


def call(client, method, path, body, headers=None):
    return client.open(path, method=method, json=body, headers=headers or {})


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"x-api-key": "nope"},
                                     {"Authorization": "Basic a2V5LW9uZQ=="}],
                         ids=["none", "wrong-bearer", "wrong-x-api-key", "other-scheme"])
def test_every_route_needs_a_key(keyed, method, path, body, headers):
    resp = call(keyed, method, path, body, headers)
    assert resp.status_code == 401, resp.get_data(as_text=True)
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    text = resp.get_data(as_text=True)
    assert "key-one" not in text and "nope" not in text
    body = resp.get_json()
    assert body["request_id"] == resp.headers["X-Request-Id"]
    if path.startswith("/v1/messages"):  # Anthropic's shape
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    else:  # OpenAI's (what OpenAI answers a wrong key with)
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(("method", "path", "body"), ROUTES[:-3])
@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer key-one"},
    {"authorization": "bearer key-two"},
    {"x-api-key": "key-two"},
    {"Authorization": "Bearer google-id-token", "x-api-key": "key-one"},  # Cloud Run IAM + key
    {"Authorization": "Bearer key-one", "x-api-key": "nope"},
], ids=["bearer", "bearer-lower", "x-api-key", "both-x-right", "both-bearer-right"])
def test_the_right_key_passes(keyed, method, path, body, headers):
    resp = call(keyed, method, path, body, headers)
    assert resp.status_code != 401, resp.get_data(as_text=True)


def test_both_headers_wrong_is_401(keyed):
    resp = keyed.post("/v1/chat/completions", json=CHAT,
                      headers={"Authorization": "Bearer a", "x-api-key": "b"})
    assert resp.status_code == 401


def test_a_stream_with_the_key(keyed):
    resp = keyed.post("/v1/chat/completions", json={**CHAT, "stream": True},
                      headers={"Authorization": "Bearer key-one", "X-Request-Id": "stream-1"})
    assert resp.status_code == 200 and resp.mimetype == "text/event-stream"
    assert resp.headers["X-Request-Id"] == "stream-1"
    assert "[DONE]" in resp.get_data(as_text=True)
    resp.close()
    assert keyed.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code == 401


def test_health_is_exempt_and_metrics_only_when_public(engine):
    client = make_client(engine, api_key=KEYS, health_route="/v1/endpoints/1/deployedModels/2")
    assert client.get("/health").status_code == 200
    assert client.get("/v1/endpoints/1/deployedModels/2").status_code == 200
    assert client.get("/metrics").status_code == 401
    public = make_client(engine, api_key=KEYS, metrics_public=True)
    assert public.get("/metrics").status_code != 401
    assert public.get("/props").status_code == 401


def test_no_keys_no_check(engine):
    client = make_client(engine)
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert engine.requests[-1].cache_scope == ""


def test_key_file(tmp_path, engine):
    path = tmp_path / "keys"
    path.write_text("# the team's keys\n\n  file-key  \n#not-a-key\nother\n")
    settings = Settings(api_key_file=path, api_key="env-key")
    assert auth.load_keys(settings) == ("env-key", "file-key", "other")
    client = make_client(engine, api_key_file=path)
    ok = {"x-api-key": "file-key"}
    assert client.post("/v1/chat/completions", json=CHAT, headers=ok).status_code == 200
    no = {"x-api-key": "#not-a-key"}
    assert client.post("/v1/chat/completions", json=CHAT, headers=no).status_code == 401


@pytest.mark.parametrize("content", ["", "# only a comment\n\n"])
def test_a_key_file_without_keys_stops_the_server(tmp_path, content):
    path = tmp_path / "keys"
    path.write_text(content)
    with pytest.raises(ValueError, match="no key"):
        create_app(Settings(api_key_file=path), engine=FakeEngine())
    with pytest.raises(ValueError, match="cannot be read"):
        auth.load_keys(Settings(api_key_file=tmp_path / "missing"))
    with pytest.raises(ValueError, match="no key"):
        auth.load_keys(Settings(api_key=" , "))


def test_keys_configured_turn_slots_off_and_never_show():
    settings = Settings(api_key="s3cret-key", api_key_file="/run/secrets/k")
    assert api_key_configured(settings) and not slots_endpoint_on(settings)
    assert not api_key_configured(Settings())
    assert "s3cret" not in repr(settings) and "/run/secrets" not in repr(settings)


def test_keys_never_in_logs_or_props(engine, caplog):
    client = make_client(engine, api_key="s3cret-key")
    with caplog.at_level(logging.DEBUG):
        client.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": "wrong-s3cret"})
        props = client.get("/props", headers={"x-api-key": "s3cret-key"})
    assert props.status_code == 200
    assert "api_key" not in props.get_json()["settings"]
    assert "s3cret" not in props.get_data(as_text=True)
    assert "s3cret" not in caplog.text


# ---- the prefix cache's scope ----------------------------------------------------------------


def test_each_key_has_its_own_cache_scope(keyed, engine):
    for key in ("key-one", "key-two", "key-one"):
        resp = keyed.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": key})
        assert resp.status_code == 200
    one, two, again = (r.cache_scope for r in engine.requests)
    assert one and two and one != two and one == again
    assert "key" not in one and len(one) == 16
    keyed.post("/predict", json=PREDICT, headers={"x-api-key": "key-two"})  # envelope greenlets
    assert engine.requests[-1].cache_scope == two


# ---- request ids -----------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "kept"), [
    ("abc-123", True), ("trace:1.2_3", True), ("x" * 128, True), ("x" * 129, False),
    ("has space", False), ("a/b", False), ("x;y", False), ("é", False), ("", False),
])
def test_request_id_is_taken_when_sane(client, given, kept):
    resp = client.get("/v1/models", headers={"X-Request-Id": given} if given else {})
    rid = resp.headers["X-Request-Id"]
    assert (rid == given) is kept
    assert 1 <= len(rid) <= 128


def test_request_id_on_errors_of_every_shape(client):
    for path, body in [("/v1/chat/completions", {"messages": 1}), ("/v1/messages", {}),
                       ("/predict", {"instances": 5}), ("/v1/nope", {})]:
        resp = client.post(path, json=body, headers={"X-Request-Id": "err-1"})
        assert resp.status_code >= 400
        assert resp.headers["X-Request-Id"] == "err-1"
        assert resp.get_json()["request_id"] == "err-1"


def capture(settings: Settings) -> tuple[io.StringIO, logging.Handler]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.formatter(settings))
    handler.addFilter(logs.RequestFilter())
    return out, handler


@pytest.fixture
def json_lines():
    """Every log line (root logger), as Cloud Logging JSON entries."""
    settings = Settings(log_format="json", google_cloud_project="my-proj")
    out, handler = capture(settings)
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


TRACE = "105445aa7843bc8bf206b12000100000"


def test_access_log_line_in_json(client, json_lines):
    resp = client.post("/v1/chat/completions", json=CHAT, headers={
        "X-Cloud-Trace-Context": f"{TRACE}/1;o=1", "User-Agent": "pytest-ua",
        "X-Request-Id": "rid-1"})
    assert resp.status_code == 200
    resp.close()
    access = [e for e in json_lines() if "httpRequest" in e]
    assert len(access) == 1
    entry = access[0]
    assert entry["severity"] == "INFO" and entry["request_id"] == "rid-1"
    assert entry["logging.googleapis.com/trace"] == f"projects/my-proj/traces/{TRACE}"
    assert entry["logging.googleapis.com/spanId"] == "0000000000000001"
    assert entry["logging.googleapis.com/trace_sampled"] is True
    http = entry["httpRequest"]
    assert http["requestMethod"] == "POST" and http["requestUrl"] == "/v1/chat/completions"
    assert http["status"] == 200 and http["userAgent"] == "pytest-ua"
    assert int(http["responseSize"]) == len(resp.get_data())
    assert http["latency"].endswith("s") and float(http["latency"][:-1]) >= 0
    assert entry["api"] == "chat" and entry["finish_reason"] == "length"
    assert entry["prompt_tokens"] == 3 and entry["completion_tokens"] == 4
    assert entry["time"].endswith("Z")


def test_a_stream_is_logged_when_it_closes(client, json_lines):
    resp = client.post("/v1/messages", json={**MESSAGES, "stream": True},
                       headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
    assert resp.status_code == 200 and resp.headers["X-Request-Id"]
    data = resp.get_data()
    resp.close()
    entry = next(e for e in json_lines() if "httpRequest" in e)
    assert entry["api"] == "messages" and entry["completion_tokens"] == 4
    assert entry["httpRequest"]["responseSize"] == str(len(data))
    assert entry["logging.googleapis.com/spanId"] == "00f067aa0ba902b7"
    assert entry["request_id"] == resp.headers["X-Request-Id"]


def test_a_path_cannot_forge_a_text_log_line(client):
    """Security review round 2, L1: a %0A in the URL path was written raw into the text
    access line, so a client could write log lines of its own choosing."""
    out, handler = capture(Settings(log_format="text"))
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    forged = "2026-01-01 00:00:00,000 INFO vertex_gguf.access FORGED POST /v1/admin 200"
    try:
        client.get("/v1/nope%0A" + forged.replace(" ", "%20") + "%0D%1B%E2%80%A8").close()
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
    lines = out.getvalue().splitlines()
    assert not any(line.startswith("2026-01-01") for line in lines), lines
    access = [line for line in lines if "vertex_gguf.access" in line and "/v1/nope" in line]
    assert len(access) == 1
    assert "/v1/nope\\n2026-01-01" in access[0] and "\\r\\x1b" in access[0]
    # WSGI paths are latin-1: a UTF-8 line separator arrives as bytes, C1 ones escaped
    assert "\\x80" in access[0]
    assert logs.escape_controls("a\u2028b\x85c") == "a\\u2028b\\x85c"


def test_a_stack_trace_in_text_logs_stays_under_its_record():
    fmt = logs.TextFormatter()
    try:
        raise ValueError("bad\nFORGED 2026-01-01 INFO line")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "p", 1, "failed", (), sys.exc_info())
    first, *rest = fmt.format(record).split("\n")
    assert " ERROR x" in first and first.endswith(": failed")
    assert rest and all(line.startswith("\t") for line in rest)


def test_lines_written_off_the_hub_carry_the_request_id(json_lines):
    info = reqctx.RequestInfo("rid-thread", TRACE)
    token = reqctx.begin(info)
    try:
        bridge.offload(lambda: logging.getLogger("app.test").warning("from a worker thread"))
    finally:
        reqctx.end(token)
    entry = next(e for e in json_lines() if e["message"] == "from a worker thread")
    assert entry["request_id"] == "rid-thread" and entry["severity"] == "WARNING"
    assert entry["logging.googleapis.com/trace"].endswith(TRACE)


def test_a_stack_trace_goes_to_the_log_never_to_the_body(json_lines):
    app = create_app(Settings(), engine=FakeEngine())

    def boom():
        raise RuntimeError("internal detail XYZZY")

    app.add_url_rule("/boom", "boom", boom)
    resp = app.test_client().get("/boom")
    assert resp.status_code == 500 and "XYZZY" not in resp.get_data(as_text=True)
    assert resp.get_json()["request_id"] == resp.headers["X-Request-Id"]
    errors = [e for e in json_lines() if e["severity"] == "ERROR"]
    assert errors and "Traceback" in errors[0]["message"] and "XYZZY" in errors[0]["message"]
    assert errors[0]["request_id"] == resp.headers["X-Request-Id"]


def test_health_probes_are_quiet(client, json_lines):
    client.get("/health").close()
    assert not [e for e in json_lines() if "httpRequest" in e]


def test_text_lines_carry_the_request_id():
    out, handler = capture(Settings(log_format="text"))
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    token = reqctx.begin(reqctx.RequestInfo("rid-9"))
    try:
        handler.handle(record)
    finally:
        reqctx.end(token)
    assert "[rid-9]: hello" in out.getvalue()


def test_log_format_auto():
    assert not log_json(Settings())
    assert log_json(Settings(k_service="svc")) and log_json(Settings(aip_mode="PREDICTION"))
    assert not log_json(Settings(k_service="svc", log_format="text"))
    assert log_json(Settings(log_format="json"))
    config = logs.logconfig(Settings(log_format="json"))
    assert config["loggers"]["gunicorn.error"]["propagate"] is True
    assert config["root"]["handlers"] == ["stderr"]


def test_gunicorn_uses_the_same_formatter():
    from app.process.gunicorn_conf import options

    opts = options(Settings(log_format="json", google_cloud_project="p"))
    fmt = opts["logconfig_dict"]["formatters"]["app"]
    assert fmt["()"] is logs.JsonFormatter and fmt["project"] == "p"


# ---- trace headers ---------------------------------------------------------------------------


@pytest.mark.parametrize(("headers", "expected"), [
    ({"X-Cloud-Trace-Context": f"{TRACE}/123;o=1"}, (TRACE, f"{123:016x}", True)),
    ({"X-Cloud-Trace-Context": f"{TRACE.upper()}/0;o=0"}, (TRACE, None, False)),
    ({"X-Cloud-Trace-Context": TRACE}, (TRACE, None, None)),
    ({"X-Cloud-Trace-Context": "0" * 32 + "/1"}, (None, None, None)),
    ({"X-Cloud-Trace-Context": "nothex/1"}, (None, None, None)),
    ({"X-Cloud-Trace-Context": f"{TRACE}/{1 << 64}"}, (TRACE, None, None)),
    ({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-00"}, (TRACE, "00f067aa0ba902b7", False)),
    ({"traceparent": f"ff-{TRACE}-00f067aa0ba902b7-01"}, (None, None, None)),
    ({"traceparent": f"00-{TRACE}-0000000000000000-01"}, (None, None, None)),
    ({"traceparent": "garbage"}, (None, None, None)),
    ({"X-Cloud-Trace-Context": "bad", "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
     (TRACE, "00f067aa0ba902b7", True)),
    ({}, (None, None, None)),
])
def test_trace_headers(headers, expected):
    assert reqctx.parse_trace(headers) == expected


def test_json_trace_without_project_is_the_bare_id():
    out, handler = capture(Settings(log_format="json"))
    token = reqctx.begin(reqctx.RequestInfo("r", TRACE, "00f067aa0ba902b7"))
    try:
        handler.handle(logging.LogRecord("x", logging.WARNING, __file__, 1, "m %s", ("é",), None))
    finally:
        reqctx.end(token)
    entry = json.loads(out.getvalue())
    assert entry["logging.googleapis.com/trace"] == TRACE and entry["message"] == "m é"
