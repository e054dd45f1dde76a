"""TextAssembler: UTF-8 split across tokens and stop strings spanning tokens."""

from app.engine.text import TextAssembler


def feed_all(asm: TextAssembler, parts: list[bytes]) -> str:
    out = "".join(asm.feed(p) for p in parts)
    return out + asm.flush()


def test_multibyte_split_across_tokens_is_never_emitted_broken():
    data = "héllo 🌍 世界".encode()
    asm = TextAssembler()
    pieces = [asm.feed(data[i : i + 1]) for i in range(len(data))]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + asm.flush() == "héllo 🌍 世界"


def test_stop_string_spanning_tokens_does_not_leak():
    asm = TextAssembler(("STOP",))
    out = [asm.feed(b"abc S"), asm.feed(b"TO"), asm.feed(b"P and more")]
    assert "".join(out) == "abc "
    assert asm.stopped
    assert asm.flush() == ""


def test_held_prefix_is_released_when_it_is_not_a_stop():
    asm = TextAssembler(("STOP",))
    assert asm.feed(b"abc ST") == "abc "
    assert asm.feed(b"ING") == "STING"
    assert not asm.stopped


def test_earliest_of_several_stops_wins():
    asm = TextAssembler(("world", "lo"))
    assert asm.feed(b"hello world") == "hel"
    assert asm.stopped


def test_held_text_is_flushed_at_the_end():
    asm = TextAssembler(("\n\n",))
    assert asm.feed(b"line\n") == "line"
    assert asm.flush() == "\n"


def test_character_cut_by_the_end_of_generation_is_dropped():
    asm = TextAssembler()
    assert asm.feed(b"ok " + "é".encode()[:1]) == "ok "
    assert asm.flush() == ""


def test_stop_inside_multibyte_text():
    assert feed_all(TextAssembler(("界",)), ["世界!".encode()[i : i + 1] for i in range(7)]) == "世"
