"""Frames from videos (app.core.video): ffmpeg in a child held to limits, over real videos made
by the test, and hostile ones; a child that overstays is killed with its whole group.

These run ffmpeg (a real part, as Redis and Chromium are elsewhere): without it they skip, or
fail under CI_REQUIRE_ALL."""

from __future__ import annotations

import ast
import io
import os
import stat
from pathlib import Path

import pytest
from PIL import Image as PILImage

from app.base.errors import BadRequest, PayloadTooLarge
from app.core import video
from app.core.media import Collected, MediaInput, MediaLimits, decode_all, decode_video
from app.core.video import VideoLimits, extract, sniff, split_png
from tests.support.images import data_url, encoded
from tests.support.videos import ffmpeg, solid
from tests.support.videos import video as make_video

ROOT = Path(__file__).resolve().parents[2]
P = "messages.0.content.1.video_url.url"


@pytest.fixture(scope="module")
def mp4() -> bytes:
    ffmpeg()
    return make_video(3, fps=4, size=(320, 240))


def sizes(frames: list[bytes]) -> list[tuple[int, int]]:
    return [PILImage.open(io.BytesIO(f)).size for f in frames]


def colours(frames: list[bytes]) -> list[tuple[int, int, int]]:
    return [PILImage.open(io.BytesIO(f)).convert("RGB").getpixel((2, 2)) for f in frames]


@pytest.mark.parametrize("container", ["mp4", "webm", "avi"])
def test_each_container_gives_a_frame_a_second(container):
    ffmpeg()
    raw = make_video(3, fps=4, container=container)
    assert sniff(raw) == {"mp4": "mov", "webm": "matroska", "avi": "avi"}[container]
    frames = extract(raw, VideoLimits(fps=1), P)
    assert len(frames) == 3
    # one frame from each second, in order: the test's colours, give or take the codec
    want = [video_colour(i) for i in range(3)]
    for got, exp in zip(colours(frames), want, strict=True):
        assert max(abs(a - b) for a, b in zip(got, exp, strict=True)) < 40, (got, exp)


def video_colour(i: int) -> tuple[int, int, int]:
    from tests.support.videos import frame

    return frame(i, (64, 48)).getpixel((2, 2))


def test_fps_and_the_frame_cap(mp4):
    assert len(extract(mp4, VideoLimits(fps=2), P)) == 6
    assert len(extract(mp4, VideoLimits(fps=4, max_frames=5), P)) == 5
    assert len(extract(mp4, VideoLimits(fps=1, max_frames=1), P)) == 1


def test_frames_are_scaled_down_never_up(mp4):
    assert set(sizes(extract(mp4, VideoLimits(max_side=64), P))) == {(64, 48)}
    assert set(sizes(extract(mp4, VideoLimits(max_side=1000), P))) == {(320, 240)}


def test_an_hour_long_video_costs_its_first_frames():
    ffmpeg()
    long = solid(3600, (32, 32))
    assert len(extract(long, VideoLimits(fps=1, max_frames=4), P)) == 4


def test_a_small_file_of_large_frames_is_scaled_within_the_limits():
    ffmpeg()
    big = solid(2, (3840, 2160))
    assert len(big) < 200_000
    frames = extract(big, VideoLimits(max_side=768), P)
    assert len(frames) == 2 and set(sizes(frames)) == {(768, 432)}


def test_declared_dimensions_past_the_pixel_limit_are_refused():
    ffmpeg()
    big = solid(2, (2000, 1000))
    with pytest.raises(BadRequest) as err:
        extract(big, VideoLimits(max_pixels=1_000_000), P)
    assert err.value.code == "invalid_video" and err.value.param == P


@pytest.mark.parametrize("raw, why", [
    (b"hello, not a video" * 10, "not an MP4/MOV"),
    (b"\x00\x00\x00\x18ftypisom" + os.urandom(4000), "cannot be decoded (mov)"),
    (b"\x1a\x45\xdf\xa3" + os.urandom(4000), "cannot be decoded (matroska)"),
    (b"RIFF\x00\x10\x00\x00AVI LIST" + os.urandom(4000), "cannot be decoded (avi)"),
    (b"", "empty"),
])
def test_garbage_is_a_400(raw, why):
    ffmpeg()
    with pytest.raises(BadRequest) as err:
        extract(raw, VideoLimits(), P)
    assert why in err.value.message and err.value.code == "invalid_video"


def test_a_truncated_video_is_a_400(mp4):
    with pytest.raises(BadRequest) as err:
        extract(mp4[: len(mp4) // 2], VideoLimits(), P)
    assert err.value.code == "invalid_video"


def test_too_many_bytes_is_a_413_before_anything_runs(tmp_path):
    ran = tmp_path / "ran"
    fake = fake_program(tmp_path, f"touch {ran}")
    with pytest.raises(PayloadTooLarge):
        extract(b"\x00\x00\x00\x18ftypisom" + bytes(5000), VideoLimits(max_bytes=4096,
                                                                       ffmpeg=fake), P)
    with pytest.raises(BadRequest):  # not a video by its bytes: nothing runs either
        extract(b"x" * 100, VideoLimits(ffmpeg=fake), P)
    assert not ran.exists()


def fake_program(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-ffmpeg"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_that_overstays_is_killed_with_its_group(tmp_path):
    """A decoder that never ends (an endless stream, a pathological file): at VIDEO_TIMEOUT
    its whole session is killed, so nothing it started is left."""
    pids = tmp_path / "pids"
    fake = fake_program(tmp_path, f"sleep 300 & echo $$ $! > {pids}; wait")
    ffmpeg()
    with pytest.raises(BadRequest) as err:
        extract(b"\x00\x00\x00\x18ftypisom" + bytes(100), VideoLimits(timeout=1.0, ffmpeg=fake),
                P)
    assert err.value.code == "video_timeout" and "VIDEO_TIMEOUT" in err.value.message
    shell, sleeper = (int(p) for p in pids.read_text().split())
    assert not alive(shell)
    for _ in range(200):  # bounded: SIGKILL reaches the grandchild at once; init reaps it
        if not alive(sleeper) or _zombie(sleeper):
            break
        __import__("time").sleep(0.01)
    assert not alive(sleeper) or _zombie(sleeper)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


def test_the_child_runs_under_its_limits(tmp_path):
    """The child's limits, as it sees them: address space, CPU, output size, files, no core
    file; stdin /dev/null, a session of its own, no environment but LC_ALL and
    MALLOC_ARENA_MAX."""
    ffmpeg()
    seen = tmp_path / "seen"
    fake = fake_program(tmp_path, f"cat /proc/self/limits > {seen}; readlink /proc/$$/fd/0 >> "
                        f"{seen}; cut -d' ' -f6 /proc/$$/stat >> {seen}; echo pid $$ >> {seen}; "
                        f"env >> {seen}")
    limits = VideoLimits(timeout=5.0, ffmpeg=fake)
    with pytest.raises(BadRequest):  # it made no frames
        extract(b"\x00\x00\x00\x18ftypisom" + bytes(100), limits, P)
    text = seen.read_text()
    rows = {line[:26].strip(): line[26:].split() for line in text.splitlines()
            if line.startswith("Max ")}
    assert rows["Max address space"][:2] == [str(video.MEMORY)] * 2
    assert rows["Max cpu time"][:2] == ["6", "6"]
    assert rows["Max file size"][:2] == [str(video.out_limit(limits))] * 2
    assert rows["Max open files"][:2] == ["32", "32"]
    assert rows["Max core file size"][:2] == ["0", "0"]
    lines = text.splitlines()
    pid = next(line.split()[1] for line in lines if line.startswith("pid "))
    assert "/dev/null" in lines and pid in lines  # stdin; the session is its own (sid = pid)
    assert [line for line in lines if "=" in line and not line.startswith(("PWD=", "SHLVL=",
                                                                             "_="))] == [
        "LC_ALL=C", "MALLOC_ARENA_MAX=1"]


def test_memory_past_the_limit_fails_cleanly(mp4):
    with pytest.raises(BadRequest) as err:
        extract(mp4, VideoLimits(memory=16 << 20), P)
    assert err.value.code == "invalid_video"


def test_split_png_drops_a_torn_frame():
    a, b = encoded("red"), encoded("blue")
    assert split_png(a + b) == [a, b]
    assert split_png(a + b[:-5]) == [a]
    assert split_png(a + b"junk") == [a]
    assert split_png(b"") == []


def test_frames_are_images_and_a_repeat_has_the_same_digests(mp4):
    limits = MediaLimits(8, 1 << 20, 25_000_000, 2048, video=VideoLimits(max_side=64))
    item = MediaInput(mp4, P, kind="video")
    first, again = decode_video(item, limits), decode_video(item, limits)
    assert [f.digest for f in first] == [f.digest for f in again]
    assert len({f.digest for f in first}) == 3 and {(f.width, f.height) for f in first} == {(64, 48)}
    # IMAGE_MAX_BYTES is for clients' images: the server's own frames are not held to it
    small = MediaLimits(8, 1024, 25_000_000, 2048, video=VideoLimits(max_side=64))
    assert [f.digest for f in decode_video(item, small)] == [f.digest for f in first]
    # beside an image, in the request's order: a video is its frames
    (img, frames) = decode_all((MediaInput(encoded("red"), "x"), item), limits)
    assert img.width == 64 and len(frames) == 3


def test_video_parts_of_each_shape():
    raw = b"\x00\x00\x00\x18ftypisom" + bytes(16)
    b64 = data_url(raw, "video/mp4").split(",", 1)[1]
    for part, param in [
        ({"type": "video_url", "video_url": {"url": data_url(raw, "video/mp4")}},
         "m.video_url.url"),
        ({"type": "input_video", "input_video": {"data": b64}}, "m.input_video.data"),
        ({"type": "input_video", "input_video": {"url": data_url(raw, "video/mp4")}},
         "m.input_video.url"),
        ({"type": "input_video", "input_video": b64}, "m.input_video"),
    ]:
        take = Collected(1 << 20, 1 << 20)
        take.part(part, "m")
        (item,) = take.items
        assert (item.kind, item.data, item.param) == ("video", raw, param)
    take = Collected(1 << 20, 1 << 20)
    take.part({"type": "video_url", "video_url": {"url": "gs://b/v.mp4"}}, "m")
    assert take.items[0].url == "gs://b/v.mp4" and take.items[0].kind == "video"
    with pytest.raises(BadRequest) as err:
        Collected(1 << 20).part({"type": "video_url", "video_url": {}}, "m")
    assert err.value.param == "m.video_url.url" and err.value.code == "invalid_video"
    # a video is held to VIDEO_MAX_BYTES, not IMAGE_MAX_BYTES
    big = data_url(bytes(8000), "video/mp4")
    Collected(1024, 1 << 20).part({"type": "video_url", "video_url": {"url": big}}, "m")
    with pytest.raises(PayloadTooLarge) as err:
        Collected(1 << 20, 4096).part({"type": "video_url", "video_url": {"url": big}}, "m")
    assert "VIDEO_MAX_BYTES" in err.value.message


def test_no_client_bytes_reach_libmtmds_own_decoders():
    """libmtmd's helper that reads a file's bytes runs ffmpeg unbounded for a video: nothing in
    the app calls it (nor its file-path twin), so the only ffmpeg is app.core.video's."""
    calls = set()
    for path in (ROOT / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("mtmd_helper_bitmap_init"):
                calls.add(f"{path.relative_to(ROOT)}: {node.attr}")
            if isinstance(node, ast.Name) and node.id.startswith("mtmd_helper_bitmap_init"):
                calls.add(f"{path.relative_to(ROOT)}: {node.id}")
    assert not calls


def test_a_clip_takes_its_part_at_its_rate():
    """Gemini's videoMetadata: from startOffset to endOffset at its fps, VIDEO_MAX_FRAMES
    still the cap."""
    ffmpeg()
    raw = make_video(4, fps=4)
    part = extract(raw, VideoLimits(fps=1), P, video.Clip(1.0, 3.0))
    assert len(part) == 2
    for got, exp in zip(colours(part), [video_colour(1), video_colour(2)], strict=True):
        assert max(abs(a - b) for a, b in zip(got, exp, strict=True)) < 40, (got, exp)
    assert len(extract(raw, VideoLimits(fps=1), P, video.Clip(0.0, 2.0, fps=2.0))) == 4
    assert len(extract(raw, VideoLimits(fps=1, max_frames=3), P, video.Clip(fps=4.0))) == 3


def test_a_server_without_ffmpeg_says_so(mp4):
    with pytest.raises(BadRequest) as err:
        extract(mp4, VideoLimits(ffmpeg="/nonexistent/ffmpeg"), P)
    assert err.value.code == "video_input_not_supported" and "ffmpeg" in err.value.message


def test_the_ffmpeg_is_video_ffmpeg_then_the_extras_then_paths(tmp_path, monkeypatch):
    """VIDEO_FFMPEG first (a path, or a name on PATH), then imageio-ffmpeg's binary (the video
    extra, without running it), then PATH's ffmpeg."""
    own = fake_program(tmp_path, "exit 0")
    wheel = tmp_path / "wheel-ffmpeg"
    wheel.write_text("#!/bin/sh\n")
    wheel.chmod(0o755)
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "ffmpeg").symlink_to(own)
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setattr(video, "bundled_ffmpeg", lambda: str(wheel))
    video.ffmpeg_program.cache_clear()
    try:
        assert video.ffmpeg_program(own) == own
        assert video.ffmpeg_program("ffmpeg") == str(on_path / "ffmpeg")  # a name: PATH's
        assert video.ffmpeg_program() == str(wheel)
        video.ffmpeg_program.cache_clear()
        monkeypatch.setattr(video, "bundled_ffmpeg", lambda: None)
        assert video.ffmpeg_program() == str(on_path / "ffmpeg")
        video.ffmpeg_program.cache_clear()
        monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
        assert video.ffmpeg_program() is None
    finally:
        video.ffmpeg_program.cache_clear()


def test_the_extras_binary_is_found_without_running_it():
    """With imageio-ffmpeg installed, its one binaries/ffmpeg-* file; without it, None."""
    found = video.bundled_ffmpeg()
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        assert found is None
        return
    assert found and Path(found).name.startswith("ffmpeg-") and os.access(found, os.X_OK)


def test_frames_go_in_pairs_to_a_projector_that_merges():
    """Qwen-VL merges two adjacent frames: pairs, an odd last frame alone, and a pair's
    digest is its frames' (the same frames, the same pair: the image cache finds it)."""
    from app.core.plan import _frame_groups
    from app.engine.types import Frames, Image

    frames = tuple(Image(b"\0\0\0", 1, 1, f"{i:064x}") for i in range(5))
    groups = _frame_groups(frames)
    assert [type(g) for g in groups] == [Frames, Frames, Image]
    assert [g.images for g in groups[:2]] == [frames[0:2], frames[2:4]] and groups[2] is frames[4]
    assert _frame_groups(frames)[0].digest == groups[0].digest != groups[1].digest
    assert _frame_groups(frames[:1]) == frames[:1]


def test_a_requests_videos_share_the_frame_cap_and_the_decode_budget(mp4):
    from app.core.decode_budget import DecodeBudget

    budget = DecodeBudget(1 << 30, wait=1.0)
    limits = MediaLimits(8, 1 << 20, 25_000_000, 2048, video=VideoLimits(max_side=64,
                                                                          max_frames=5),
                         budget=budget)
    item = MediaInput(mp4, P, kind="video")
    first, second = decode_all((item, item), limits)
    assert (len(first), len(second)) == (3, 2)  # the second gets what the first left
    # the extraction held the child's share of the worker's budget, and gave it back
    assert budget.peak >= limits.video.memory // 2 and budget.used == 0
    with pytest.raises(BadRequest) as err:
        decode_all((item, item, item), limits)
    assert err.value.code == "too_many_frames" and err.value.param == P


def test_no_room_for_the_files_is_a_503_not_the_clients_error(mp4, monkeypatch):
    from app.base.errors import Unavailable

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(video.tempfile, "TemporaryDirectory", full)
    with pytest.raises(Unavailable) as err:
        extract(mp4, VideoLimits(), P)
    assert "No space left" in err.value.message and err.value.param == P


def test_a_tiny_clip_rate_reads_a_day_at_most():
    argv = video.command(VideoLimits(), "mov", "/x", video.Clip(0.0, None, 1e-300))
    assert float(argv[argv.index("-t") + 1]) == 86400.0
