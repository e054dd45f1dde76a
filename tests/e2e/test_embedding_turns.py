"""How the embedder shares its decodes (security round 3, issue 47): a big batch must not hold
another key's small request for more than the decode in progress, and a batch whose caller has
gone stops at the next decode. Real llama.cpp: a tiny BERT GGUF in an in-process engine, whose
decodes the test hands out one at a time (a gate in place of the generation/embedding turns),
and a real server on the default model for the hang-up.

Structure only: which decodes ran, what each answered, in which order; never how long."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from app import engine_config
from app.base.errors import ClientGone
from app.base.state import LoadState
from app.engine.embed import EmbedRequest
from app.engine.llama_engine import LlamaEngine
from app.settings import Settings
from tests.support.metrics import scrape
from tests.support.server import running_server, wait_for
from tests.support.tiny_bert import N_CTX, build_tiny_bert
from tests.support.turn_gate import Gate

BATCH = 4  # EMBEDDING_BATCH: inputs per decode
BIG = tuple(f"the cat sat on the mat {i}" for i in range(6 * BATCH))  # six decodes' worth
LONG = tuple((7 + i,) * N_CTX for i in range(6))  # token ids filling a decode each


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[LlamaEngine]:
    path = str(build_tiny_bert(Path(tmp_path_factory.mktemp("bert")) / "tiny-bert.gguf"))
    settings = Settings(model=path, threads=1, embedding_batch=BATCH)
    eng = LlamaEngine(engine_config(settings), LoadState(), lambda _: path)
    eng.start()
    wait_for(lambda: eng.state.ready or eng.state.stage == "failed", 120, "the engine to load")
    assert eng.state.ready, eng.state.snapshot()
    yield eng
    eng.shutdown()


@pytest.fixture
def gate(engine) -> Iterator[Gate]:
    emb = engine.embedder
    turns, g = emb._turns, Gate()
    emb._turns = g
    yield g
    g.let_all_go()
    emb._turns = turns


def decoded(engine: LlamaEngine) -> int:
    """Inputs the embedder has decoded, from its decodes' widths."""
    return inputs(engine.embedder.stats())


def inputs(stats: dict) -> int:
    return sum(int(width) * n for width, n in stats["batch_widths"].items())


@pytest.mark.parametrize("big, per_decode", [(BIG, BATCH), (LONG, 1)], ids=["short", "long"])
def test_a_small_request_waits_at_most_the_decode_in_progress(engine, gate, big, per_decode):
    """The one-input request goes in the decode right after the big batch's first one, alone:
    none of the big batch's inputs lengthen the decode that answers it. With inputs that fill
    a decode each ("long": cut to the context, as Vertex's autoTruncate does), the old
    round-robin found no room for it until the big batch had ended."""
    before = decoded(engine)
    first = engine.embedder.submit(EmbedRequest(big))
    gate.until_started(1)  # the big batch's first decode is in progress
    small = engine.embedder.submit(EmbedRequest(("hello world",)))
    for n in (2, 3):  # decode 2 runs; decode 3 reaches the gate
        gate.release()
        gate.until_started(n)
    [answer] = small.result(1)  # answered before decode 3 began
    assert answer.tokens > 0
    # by then the big batch had had one decode: the one in progress when it came
    assert decoded(engine) - before == per_decode + 1
    assert engine.embedder.stats()["batch_widths"].get("1", 0) >= 1  # its decode: it alone
    gate.let_all_go()
    assert len(first.result(60)) == len(big)  # the big batch then ran to its end
    assert decoded(engine) - before == len(big) + 1


def test_two_big_batches_take_turns(engine, gate):
    """Two big requests alternate decodes: neither waits for the other to finish."""
    first = engine.embedder.submit(EmbedRequest(BIG))
    gate.until_started(1)
    second = engine.embedder.submit(EmbedRequest(BIG[: 2 * BATCH]))  # two decodes' worth
    for n in range(2, 6):  # decodes 2, 3, 4 (second, first, second) run; 5 reaches the gate
        gate.release()
        gate.until_started(n)
    # answered by then: its two decodes were the 2nd and the 4th (its outcome is sent before
    # the next decode begins)
    assert len(second.result(1)) == 2 * BATCH
    assert engine.embedder.stats()["batch_widths"].get(str(BATCH), 0) >= 4
    gate.let_all_go()
    assert len(first.result(60)) == len(BIG)


def test_a_batch_whose_caller_went_stops_at_the_next_decode(engine, gate):
    """The embedder asks the request's own probe at every decode: once the caller is gone, the
    batch's remaining inputs are skipped and counted, and no other decode of it runs."""
    stats = engine.embedder.stats()
    gone = [False]
    big = engine.embedder.submit(EmbedRequest(BIG, gone=lambda: gone[0]))
    gate.until_started(1)
    gone[0] = True  # the client hangs up while its first decode runs
    gate.release()
    with pytest.raises(ClientGone):
        big.result(60)
    after = engine.embedder.stats()
    assert gate.started == 1  # no second decode of it
    assert after["inputs"] - stats["inputs"] == BATCH
    assert after["cancelled"] - stats["cancelled"] == 1
    assert after["inputs_skipped"] - stats["inputs_skipped"] == len(BIG) - BATCH


# ---- a real server: the client hangs up ----------------------------------------------------

KEY_A, KEY_B = "embed-key-a-0123456789", "embed-key-b-0123456789"


def counters(srv) -> dict:
    return requests.get(srv.url("/health"), timeout=30).json()["embeddings"]


def disconnects(srv) -> float:
    return scrape(srv).get(("vertex_gguf_client_disconnects_total", (("api", "embeddings"),)), 0)


def test_a_client_that_hangs_up_on_a_big_batch_stops_it_at_the_next_decode(default_model):
    """1024 inputs, two per decode: the client hangs up after the first decodes; at most the
    decode then in progress runs after, the rest is skipped, and another key's request is
    answered. Counted by the server's own counters, not timed."""
    env = {"EMBEDDINGS": "on", "EMBEDDING_BATCH": "2", "EMBEDDING_CTX": "256", "PARALLEL": "2",
           "API_KEY": f"{KEY_A},{KEY_B}", "METRICS_PUBLIC": "true"}
    texts = [f"a short text number {i}" for i in range(1024)]
    body = json.dumps({"input": texts}).encode()
    with running_server(env) as srv:
        before, gone_before = counters(srv), disconnects(srv)
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nAuthorization: Bearer " + KEY_A.encode()
                     + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_for(lambda: inputs(counters(srv)) - inputs(before) >= 4, 120,
                 "the batch's first decodes")
        sock.close()  # on loopback the server's socket reads as closed once this returns
        at_hangup = counters(srv)
        wait_for(lambda: disconnects(srv) > gone_before, 60, "the hang-up to be counted")
        r = requests.post(srv.url("/v1/embeddings"), json={"input": "another key's text"},
                          headers={"Authorization": f"Bearer {KEY_B}"}, timeout=120)
        assert r.status_code == 200 and len(r.json()["data"]) == 1
        after = counters(srv)
    ran = inputs(after) - inputs(at_hangup) - 1  # the batch's inputs decoded after the hang-up
    assert ran <= 2, f"{ran} inputs of the hung-up batch were decoded after it hung up"
    assert after["cancelled"] - before["cancelled"] == 1
    done = inputs(after) - inputs(before) - 1
    assert after["inputs_skipped"] - before["inputs_skipped"] == len(texts) - done
    assert after["inputs"] - before["inputs"] == done + 1
