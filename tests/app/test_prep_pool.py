"""/health and the hub's request-preparation threads (app.base.bridge.offload): it reports
them (``prep_threads``), and answers 503 when every one has been held past WATCHDOG_SECONDS,
so the platform replaces a replica that can no longer prepare any request; a request that
finds no free thread gets its 503 at PREPARE_TIMEOUT, in its API's shape."""

from __future__ import annotations

import gevent

from app.engine.fake import FakeEngine
from tests.support.app import make_client
from tests.support.pool import full_pool

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_health_reports_the_pool_and_fails_while_every_thread_is_held():
    client = make_client(FakeEngine(), watchdog_seconds=0.001, prepare_timeout=0.2)
    size = gevent.get_hub().threadpool.maxsize
    idle = client.get("/health")
    assert idle.status_code == 200
    assert idle.get_json()["prep_threads"] == {"size": size, "busy": 0, "stray": 0}
    with full_pool():
        held = client.get("/health")
        assert held.status_code == 503
        body = held.get_json()
        assert body["status"] == "stalled" and "request-preparation threads" in body["reason"]
        assert body["prep_threads"] == {"size": size, "busy": size, "stray": 0}
        refused = client.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503
        assert refused.get_json()["error"]["code"] == "overloaded"
        assert "PREPARE_TIMEOUT" in refused.get_json()["error"]["message"]
    assert client.get("/health").status_code == 200
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
