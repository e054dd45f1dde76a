"""Who gets the engine when it is full, end to end on the real model: one API key cannot take
every slot and the whole queue from the others (security3 M4), and a short prompt is not held
behind another request's long one (security3 L1). Structure only: which request was admitted,
which got a 429, which got its tokens before which."""

from __future__ import annotations

import json
import threading

import requests

from tests.support.server import ServerProcess, running, wait_for

KEY_A, KEY_B = "fair-key-a-0123456789", "fair-key-b-0123456789"
WORDS = "The quick brown fox jumps over the lazy dog. "  # 10 tokens


class Streams:
    """Streamed completions read on threads, each one's first text and end noted in the order
    the client saw them."""

    def __init__(self, srv: ServerProcess):
        self.srv = srv
        self.seen: list[str] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def post(self, key: str | None, body: dict, path: str = "/v1/completions") -> requests.Response:
        """The request's response once its headers came, not read yet: a stream's headers come
        with its first bytes, a heartbeat's while it waits for a slot, so they say it was
        accepted (it is in the engine's queue)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return requests.post(self.srv.url(path), json={**body, "stream": True},
                             headers=headers, stream=True, timeout=300)

    def read(self, name: str, r: requests.Response) -> None:
        def run() -> None:
            first = True
            try:
                for line in r.iter_lines():
                    if line == b"data: [DONE]":
                        self._note(f"{name} done")
                    elif line.startswith(b"data: {") and first:
                        choices = json.loads(line[6:])["choices"]
                        if choices and (choices[0].get("text")
                                        or (choices[0].get("delta") or {}).get("content")):
                            self._note(f"{name} first")
                            first = False
            except (requests.RequestException, AttributeError, OSError):
                pass  # closed by the test, from its own thread

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._threads.append(t)

    def _note(self, event: str) -> None:
        with self._lock:
            self.seen.append(event)

    def has(self, *events: str) -> bool:
        with self._lock:
            return all(e in self.seen for e in events)


def test_one_key_cannot_take_the_whole_queue_and_another_is_served_first(server_factory):
    """PARALLEL 2, MAX_QUEUE 4 (so MAX_QUEUE_PER_KEY is 2): key B runs two long streams and
    asks for four more; two wait and two get a 429. Key A's request is still admitted, and
    when one of B's streams ends A's request takes the slot before B's waiting ones (A holds
    no slot, B holds one). Before, B's six filled PARALLEL + MAX_QUEUE and A got a 429."""
    srv = server_factory({"PARALLEL": "2", "MAX_QUEUE": "4", "API_KEY": f"{KEY_A},{KEY_B}",
                          "PREFILL_CHUNK": "64", "STREAM_HEARTBEAT_SECONDS": "1"})
    srv.wait_ready()
    streams = Streams(srv)
    long_run = {"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
    # B's waiting ones: a prompt of ~10 chunks, so each one's first token is steps away from
    # its admission
    waiting = {"prompt": WORDS * 60, "max_tokens": 2, "temperature": 0}
    held = [streams.post(KEY_B, long_run) for _ in range(2)]
    opened = list(held)  # closed at the end, whatever happens
    try:
        assert [r.status_code for r in held] == [200, 200]
        for i, r in enumerate(held):
            streams.read(f"H{i}", r)  # read as they come: a client that does not read stalls
        wait_for(lambda: running(srv) == 2, 60, "B's two streams in the slots")
        more = [streams.post(KEY_B, waiting) for _ in range(4)]
        opened += more
        assert [r.status_code for r in more] == [200, 200, 429, 429]
        assert more[2].json()["error"]["code"] == "queue_full"
        assert "MAX_QUEUE_PER_KEY" in more[2].json()["error"]["message"]
        for i, r in enumerate(more[:2]):
            streams.read(f"B{i}", r)
        a = streams.post(KEY_A, {"prompt": "Say hello.", "max_tokens": 4, "temperature": 0})
        opened.append(a)
        assert a.status_code == 200, a.text  # accepted: in the engine's queue now
        streams.read("A", a)
        held[0].close()  # one of B's streams ends: its slot is free
        wait_for(lambda: streams.has("A done"), 300, "A's answer")
        # had one of B's waiting requests taken the slot, its first token (after ~10 steps of
        # prompt) would have come before A's answer, which would have waited for it to end
        seen = streams.seen
        assert "B0 first" not in seen[:seen.index("A done")], seen
        assert "B1 first" not in seen[:seen.index("A done")], seen
    finally:
        for r in opened:
            r.close()


def test_a_short_prompt_is_answered_while_a_long_one_is_still_being_decoded(server_factory):
    """PREFILL_CHUNK 16 and a ~630-token prompt: ~40 steps of prefill. It takes slot 0 (it
    reuses the chat template's opening decoded there at load), the slot whose prompt slot order
    served first; a short chat sent meanwhile takes slot 1. The step's budget is shared, so
    the short one's first token comes before the long one's (its prompt's end). Before, the
    short one waited for the whole long prompt."""
    srv = server_factory({"PARALLEL": "2", "PREFILL_CHUNK": "16", "STREAM_HEARTBEAT_SECONDS": "0"})
    srv.wait_ready()
    streams = Streams(srv)
    chat = "/v1/chat/completions"

    def long_slot() -> int | None:
        rows = requests.get(srv.url("/slots"), timeout=10).json()
        return next((r["id"] for r in rows if r["n_prompt_tokens"] > 400
                     and 0 < r["n_prompt_tokens_processed"] < r["n_prompt_tokens"]), None)

    long = streams.post(None, {"messages": [{"role": "user", "content": WORDS * 60}],
                               "max_tokens": 2, "ignore_eos": True, "temperature": 0}, chat)
    try:
        assert long.status_code == 200, long.text
        streams.read("long", long)
        slot = wait_for(lambda: [s for s in [long_slot()] if s is not None], 120,
                        "the long prompt being decoded")[0]
        assert slot == 0, slot
        short = streams.post(None, {"messages": [{"role": "user", "content": "Say hello."}],
                                    "max_tokens": 2, "ignore_eos": True, "temperature": 0}, chat)
        assert short.status_code == 200, short.text
        streams.read("short", short)
        wait_for(lambda: streams.has("long done", "short done"), 300, "both answers")
        seen = streams.seen
        assert "short first" in seen and "long first" in seen, seen
        assert seen.index("short first") < seen.index("long first"), seen
    finally:
        long.close()
