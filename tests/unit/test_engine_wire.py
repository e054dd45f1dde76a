"""The engine process's wire (app.engine.wire) and its outbox (app.engine.child.Outbox): frames
survive being read many to a read, errors cross whole, and a step's events leave as one
message, not one per token."""

from __future__ import annotations

import os

from app.base.errors import ContextOverflow, EmbeddingOnly, QueueFull
from app.base.threads import ThreadEvent, held_wakes, start_native_thread
from app.engine.child import Outbox
from app.engine.types import Accepted, Failed, Finished, TextPiece
from app.engine.wire import Reader, Writer, frame, write_all


class Sent:
    """A Writer's stand-in that keeps what was sent."""

    def __init__(self) -> None:
        self.messages: list[tuple] = []

    def send(self, msg: tuple) -> None:
        self.messages.append(msg)


def test_frames_read_back_in_order_many_to_a_read():
    r, w = os.pipe()
    try:
        msgs = [("events", [(i, TextPiece(f"t{i}", i))]) for i in range(200)]
        os.write(w, b"".join(frame(m) for m in msgs))  # 200 frames, well inside a pipe
        os.close(w)
        reader = Reader(r)
        got = [reader.recv() for _ in msgs]
        assert got == msgs
        try:
            reader.recv()
        except EOFError:
            pass
        else:
            raise AssertionError("no EOFError at the end")
    finally:
        os.close(r)


def test_errors_cross_whole_whatever_their_init_takes():
    r, w = os.pipe()
    try:
        writer = Writer(w)
        overflow = ContextOverflow("too long", param="messages", tokens=9, limit=4)
        writer.send(("events", [(1, Failed(overflow)), (2, EmbeddingOnly(reranks=True)),
                                (3, QueueFull("busy"))]))
        os.close(w)
        (_, items) = Reader(r).recv()
    finally:
        os.close(r)
    first, second, third = (item for _, item in items)
    assert isinstance(first.error, ContextOverflow)
    assert (first.error.message, first.error.param, first.error.tokens,
            first.error.limit, first.error.code) == ("too long", "messages", 9, 4,
                                                     "context_length_exceeded")
    assert isinstance(second, EmbeddingOnly) and "only reranks" in second.message
    assert str(second) == second.message
    assert isinstance(third, QueueFull) and third.retry_after == 1


def test_a_writer_to_a_closed_peer_stops_quietly():
    r, w = os.pipe()
    os.close(r)
    writer = Writer(w)
    try:
        writer.send(("events", []))
        writer.send(("events", []))
        assert writer.broken
    finally:
        os.close(w)


def test_a_steps_events_leave_as_one_message():
    wire = Sent()
    boxes = [Outbox(rid, wire) for rid in (1, 2, 3)]  # type: ignore[arg-type]
    with held_wakes():
        for k in range(1, 3):
            for box in boxes:
                box.put(TextPiece("x", k))
        assert wire.messages == []  # nothing leaves mid-step
    assert len(wire.messages) == 1
    kind, items = wire.messages[0]
    assert kind == "events" and [rid for rid, _ in items] == [1, 2, 3, 1, 2, 3]


def test_outside_a_step_each_event_leaves_at_once():
    wire = Sent()
    box = Outbox(7, wire)  # type: ignore[arg-type]
    box.put(Accepted(prompt_tokens=3))
    box.put(TextPiece("a", 1))
    assert wire.messages == [("events", [(7, Accepted(3))]), ("events", [(7, TextPiece("a", 1))])]


def test_a_request_is_over_after_its_last_choice_or_its_failure():
    over: list[int] = []
    wire = Sent()
    gen = Outbox(1, wire, left=2, done=over.append)  # type: ignore[arg-type]
    gen.put(Accepted(3))
    gen.put(Finished("stop", 3, 1, index=1))
    assert over == []
    gen.put(Finished("stop", 3, 1, index=0))
    assert over == [1]
    failed = Outbox(2, wire, left=3, done=over.append)  # type: ignore[arg-type]
    failed.put(Failed(QueueFull("busy")))
    embed = Outbox(3, wire, done=over.append)  # type: ignore[arg-type]
    embed.put([])
    assert over == [1, 2, 3]


def test_a_reader_behind_takes_every_arrived_message_at_once():
    """recv_many: every whole frame that has arrived, a frame larger than one read included
    (written by a thread: it outgrows the pipe), and never half of one."""
    r, w = os.pipe()
    big = ("events", [(1, TextPiece("x" * 300_000, 1))])
    small = [("events", [(i, TextPiece("y", i))]) for i in range(3)]
    done = ThreadEvent()

    def write() -> None:
        try:
            os.write(w, b"".join(frame(m) for m in small))
            write_all(w, frame(big) + frame(small[0]))
        finally:
            os.close(w)
            done.set()

    start_native_thread(write)
    try:
        reader = Reader(r)
        got: list = []
        for _ in range(10):  # bounded: five messages in at most a few reads
            if len(got) == 5:
                break
            batch = reader.recv_many()
            assert batch  # never empty
            got += batch
        assert got == [*small, big, small[0]]
        assert done.wait(10)
    finally:
        os.close(r)
