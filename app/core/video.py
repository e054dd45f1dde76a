"""Frames from a request's video, extracted by ffmpeg in a child process held to limits.

libmtmd decodes no video itself: its helper (``mtmd_helper_bitmap_init_from_buf``) runs the
ffmpeg on PATH over whatever bytes it gets, with no frame cap, scaling, timeout or memory
limit. So this server never hands it client bytes (app.core.media gives libmtmd RGB pixels
only) and extracts frames here instead, where a hostile file can cost at most:

- bytes: VIDEO_MAX_BYTES, checked before anything runs; the container is judged by its magic
  bytes (MP4/MOV, Matroska/WebM, AVI, GIF) and ffmpeg is told that format (``-f``), so no
  other demuxer, and no protocol but the one file (``-protocol_whitelist file``), is reached;
- pixels: ``-max_pixels`` makes the decoder refuse a frame larger than IMAGE_MAX_PIXELS
  before it allocates it; frames come out scaled down to VIDEO_MAX_SIDE;
- frames and time: VIDEO_FPS from the start, at most VIDEO_MAX_FRAMES (``-frames:v``), and
  ``-t`` stops the read at the last frame's time, so an hour-long file costs what its first
  seconds do;
- the child: one decoding thread (``-threads 1``), an address-space limit (RLIMIT_AS,
  512 MiB), a CPU limit, an output-size limit (RLIMIT_FSIZE: its frames, as PNG, go to a
  file), few files (RLIMIT_NOFILE), no core file, no stdin, no environment but LC_ALL=C and
  MALLOC_ARENA_MAX=1; a session of its own, killed as a group at VIDEO_TIMEOUT (or sooner
  when the request's preparation gives up), and always reaped: nothing is left running.

The limits are set by util-linux's ``prlimit`` (in every Debian image) before it runs ffmpeg,
so they hold from ffmpeg's first instruction. The child is started with ``posix_spawn`` and
polled: the request's preparation runs on a native thread, where gevent's subprocess cannot
watch a child.

The ffmpeg is, in order (``ffmpeg_program``): VIDEO_FFMPEG, the binary in the ``video`` extra's
imageio-ffmpeg wheel (what the image ships: one ffmpeg that needs nothing but glibc), the
``ffmpeg`` on PATH.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import signal
import struct
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

from app.base import bridge
from app.base.errors import BadRequest, PayloadTooLarge, Unavailable
from app.base.threads import close_fd, original, original_sleep

log = logging.getLogger(__name__)

# The child's address space (bytes). imageio-ffmpeg's ffmpeg maps its own 165 MiB file; its
# threads (ffmpeg 9 runs demuxer, decoder, filters and muxer each on one, -threads 1 or not) would
# each get a glibc malloc arena reserving 64 MiB of address space: a 16-megapixel frame failed 5
# of 10 tries, and 6 of 6 in another run, at 512 MiB (768 MiB held it). One arena (MALLOC_ARENA_MAX=1, ENV) fixes that:
# measured, that binary then needs 256 MiB for a small video, 272 MiB at 1080p and 288 MiB for a
# 24-megapixel frame (IMAGE_MAX_PIXELS is 25 M), Debian's ffmpeg 5.1 288, 304 and 400 MiB.
MEMORY = 512 << 20
ENV = {"LC_ALL": "C", "MALLOC_ARENA_MAX": "1"}  # the child's whole environment
_POLL = 0.01  # seconds between looks at the child
_PNG = b"\x89PNG\r\n\x1a\n"
_ADDRESS = re.compile(r" ?@ 0x[0-9a-f]+")  # ffmpeg's "[mov @ 0x55d4...]": a pointer, not news


@dataclass(frozen=True)
class VideoLimits:
    """VIDEO_FPS, VIDEO_MAX_FRAMES, VIDEO_MAX_SIDE, VIDEO_MAX_BYTES, VIDEO_TIMEOUT and
    IMAGE_MAX_PIXELS (the largest frame a decoder may allocate); ``ffmpeg`` and ``prlimit``:
    the programs' paths (None: found on PATH)."""

    fps: float = 1.0
    max_frames: int = 32
    max_side: int = 768
    max_bytes: int = 64 << 20
    timeout: float = 20.0
    max_pixels: int = 25_000_000
    memory: int = MEMORY
    ffmpeg: str | None = None
    prlimit: str | None = None


@dataclass(frozen=True)
class Clip:
    """The part of a video a request asks for (Gemini's ``videoMetadata``): from ``start``
    seconds, up to ``end`` (None: the end), at ``fps`` frames a second (None: VIDEO_FPS).
    VIDEO_MAX_FRAMES still bounds the frames."""

    start: float = 0.0
    end: float | None = None
    fps: float | None = None


def sniff(data: bytes) -> str | None:
    """ffmpeg's demuxer for the container the bytes start with, or None: ISO media (MP4,
    MOV, 3GP: an ``ftyp`` box first), Matroska and WebM (the EBML magic), AVI, GIF."""
    if len(data) >= 12 and data[4:8] == b"ftyp":
        return "mov"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    return None


@lru_cache(maxsize=8)
def _program(name: str, given: str | None) -> str | None:
    return shutil.which(given or name)


def bundled_ffmpeg() -> str | None:
    """imageio-ffmpeg's binary (the ``video`` extra), or None when that package is not
    installed or holds none for this platform. Its ``get_ffmpeg_exe()`` is not called: it
    runs the program (``-version``, through subprocess, which a native thread cannot watch
    under gevent) and falls back to PATH's; the wheel's one ``binaries/ffmpeg-*`` file is
    taken as is."""
    try:
        from importlib.resources import files

        found = sorted(str(f) for f in files("imageio_ffmpeg.binaries").iterdir()
                       if f.name.startswith("ffmpeg-") and not f.name.endswith(".exe"))
    except (ImportError, OSError, TypeError):  # not installed, or not a folder on disk
        return None
    return next((f for f in found if os.access(f, os.X_OK)), None)


@lru_cache(maxsize=8)
def ffmpeg_program(given: str | None = None) -> str | None:
    """The ffmpeg that extracts frames (and that the tests make their videos with): ``given``
    (VIDEO_FFMPEG: a path, or a name looked up on PATH; None when it is not there), else
    imageio-ffmpeg's binary, else the ``ffmpeg`` on PATH. Logged once (cached per ``given``)."""
    if given:
        found, source = shutil.which(given), "VIDEO_FFMPEG"
    else:
        found, source = bundled_ffmpeg(), "the video extra's imageio-ffmpeg"
        if not found:
            found, source = shutil.which("ffmpeg"), "PATH"
    if found:
        # the wheel's file name carries ffmpeg's version (ffmpeg-linux-x86_64-v9.0.2): no run
        bridge.log_on_hub(log, logging.INFO, "video: ffmpeg is %s (from %s)", found, source)
    else:
        bridge.log_on_hub(log, logging.WARNING, "video: no ffmpeg (%s); video parts are a 400",
                          f"VIDEO_FFMPEG={given} not found" if given else "none installed")
    return found


def command(limits: VideoLimits, fmt: str, path: str, clip: Clip | None = None) -> list[str]:
    """ffmpeg's arguments: the one file, in ``fmt``, to PNG frames on stdout."""
    clip = clip or Clip()
    fps = clip.fps or limits.fps
    side = limits.max_side
    seconds = limits.max_frames / fps + 1.0  # the last frame's time, and a second to find it
    if clip.end is not None:
        seconds = min(seconds, max(0.001, clip.end - clip.start))
    seconds = min(seconds, 86400.0)  # a tiny fps (Gemini's takes any above 0): a day at most
    start = ["-ss", f"{clip.start:.3f}"] if clip.start > 0 else []
    scale = (f"scale=w='min({side},iw)':h='min({side},ih)'"
             ":force_original_aspect_ratio=decrease:flags=bicubic")
    return ["-nostdin", "-hide_banner", "-loglevel", "error",
            "-threads", "1", "-filter_threads", "1",
            "-max_pixels", str(limits.max_pixels),
            "-protocol_whitelist", "file", "-f", fmt, *start, "-t", f"{seconds:.3f}",
            "-i", f"file:{path}",
            "-map", "0:v:0", "-an", "-sn", "-dn",
            "-vf", f"fps={fps:g},{scale}", "-frames:v", str(limits.max_frames),
            "-f", "image2pipe", "-c:v", "png", "-pix_fmt", "rgb24", "-compression_level", "1",
            "pipe:1"]


def out_limit(limits: VideoLimits) -> int:
    """The most bytes the frames can take as PNG: stored (uncompressed) rows and headers."""
    side = limits.max_side
    return limits.max_frames * (side * (3 * side + 1) + 65536) + (1 << 20)


def extract(data: bytes, limits: VideoLimits, param: str, clip: Clip | None = None
            ) -> list[bytes]:
    """The video's frames as PNG files (each at most VIDEO_MAX_SIDE a side), in order; a 400
    (or 413) for anything that is not a video this server reads within its limits."""
    if not data:
        raise BadRequest("video is empty", param=param, code="invalid_video")
    if len(data) > limits.max_bytes:
        raise PayloadTooLarge(
            f"video is {len(data)} bytes, over {limits.max_bytes} (VIDEO_MAX_BYTES)", param=param)
    fmt = sniff(data)
    if fmt is None:
        raise BadRequest("video is not an MP4/MOV, WebM/Matroska, AVI or GIF file (judged by "
                         "its bytes)", param=param, code="invalid_video")
    ffmpeg, prlimit = ffmpeg_program(limits.ffmpeg), _program("prlimit", limits.prlimit)
    if not ffmpeg or not prlimit:
        raise BadRequest("this server reads no video: ffmpeg is not installed where it runs",
                         param=param, code="video_input_not_supported")
    timeout = limits.timeout
    left = bridge.time_left()
    if left is not None:
        timeout = max(0.1, min(timeout, left))
    try:
        return _extract(data, limits, param, clip, fmt, ffmpeg, prlimit, timeout)
    except OSError as err:  # no room for the files, or no process to be had: not the client's
        bridge.log_on_hub(log, logging.WARNING, "video not read: %s", err)
        raise Unavailable(f"the server cannot read a video now ({err.strerror or err}): retry",
                          param=param) from None


def _extract(data: bytes, limits: VideoLimits, param: str, clip: Clip | None, fmt: str,
             ffmpeg: str, prlimit: str, timeout: float) -> list[bytes]:
    with tempfile.TemporaryDirectory(prefix="vg-video-") as tmp:
        src, out, err = (os.path.join(tmp, n) for n in ("in", "out", "err"))
        with open(src, "wb") as f:
            f.write(data)
        argv = [prlimit, f"--as={limits.memory}", f"--cpu={math.ceil(timeout) + 1}",
                f"--fsize={out_limit(limits)}", "--nofile=32", "--core=0", "--",
                ffmpeg, *command(limits, fmt, src, clip)]
        status = _run(argv, out, err, timeout, param)
        with open(out, "rb") as f:
            frames = split_png(f.read())
        if status != 0 or not frames:
            with open(err, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 1000))
                why = f.read().decode("utf-8", "replace").replace(f"file:{src}", "the video")
                why = _ADDRESS.sub("", why.replace(src, "the video")).strip()
            bridge.log_on_hub(log, logging.INFO, "video not read (%s, exit %s, %d frames): %s",
                              fmt, status, len(frames), why[-500:])
            if status == -signal.SIGXFSZ:
                raise PayloadTooLarge("video's frames are over the server's limit", param=param)
            if not frames or status not in (0, None):
                said = why.splitlines()[-1][:200] if why else f"exit status {status}"
                raise BadRequest(f"video cannot be decoded ({fmt}): no frame could be read "
                                 f"within the server's limits (ffmpeg: {said})", param=param,
                                 code="invalid_video")
    return frames[:limits.max_frames]


def _run(argv: list[str], out: str, err: str, timeout: float, param: str) -> int | None:
    """Runs ``argv`` (stdin /dev/null, stdout to ``out``, stderr to ``err``) in a session of
    its own; its exit status (negative: the signal; None: someone else reaped it), or a 400
    after killing the whole group at ``timeout``."""
    # the originals: gevent's would watch the child from this thread's loop, which cannot
    waitpid, spawn = original("os", "waitpid"), original("os", "posix_spawn")
    out_fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err_fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        pid = spawn(argv[0], argv, ENV, setsid=True, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_fd, 1), (os.POSIX_SPAWN_DUP2, err_fd, 2)])
    finally:
        close_fd(out_fd)
        close_fd(err_fd)
    deadline = time.monotonic() + timeout
    reaped = False
    try:
        while True:  # bounded: the deadline ends it
            try:
                done, status = waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped by another waiter (gevent's SIGCHLD watcher)
                reaped = True
                return None
            if done:
                reaped = True
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() >= deadline:
                raise BadRequest(f"video took over {timeout:g} s to decode (VIDEO_TIMEOUT)",
                                 param=param, code="video_timeout")
            original_sleep(_POLL)
    finally:
        if not reaped:
            _kill(pid, waitpid)


def _kill(pid: int, waitpid) -> None:
    """Kills the child's whole session (its process group) and reaps it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        waitpid(pid, 0)


def split_png(data: bytes) -> list[bytes]:
    """Back-to-back PNG files cut apart by their chunks (a file ends with IEND); a torn last
    one is dropped. Bounded by the data: every step moves forward."""
    frames: list[bytes] = []
    pos = 0
    while data.startswith(_PNG, pos):
        at = pos + len(_PNG)
        while at + 12 <= len(data):
            (length,) = struct.unpack_from(">I", data, at)
            kind = data[at + 4:at + 8]
            at += 12 + length
            if kind == b"IEND":
                break
        else:
            return frames
        if at > len(data):
            return frames
        frames.append(data[pos:at])
        pos = at
    return frames
