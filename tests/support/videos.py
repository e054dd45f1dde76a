"""Videos for the video tests, made here: frames drawn with Pillow, encoded by the ffmpeg the
server extracts frames with (app.core.video.ffmpeg_program: the video extra's imageio-ffmpeg
binary, else PATH's; MPEG-4 in MP4, VP8 in WebM, MJPEG in AVI, which both encode). Without
ffmpeg a test skips, or fails under CI_REQUIRE_ALL (.ci/run installs the extra)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from app.core.video import ffmpeg_program

CODECS = {"mp4": ["-c:v", "mpeg4", "-q:v", "5"], "webm": ["-c:v", "libvpx", "-b:v", "200k"],
          "avi": ["-c:v", "mjpeg", "-q:v", "5"]}


def ffmpeg() -> str:
    """ffmpeg's path; the test skips without it (fails under CI_REQUIRE_ALL)."""
    found = ffmpeg_program()
    if found and shutil.which("prlimit"):
        return found
    why = ("ffmpeg (or prlimit) is not installed: pip install '.[video]' (.ci/run installs "
           "it), or ffmpeg on PATH")
    if os.environ.get("CI_REQUIRE_ALL"):
        pytest.fail(why)
    pytest.skip(why)


def frame(i: int, size: tuple[int, int]) -> Image.Image:
    """Frame ``i``: its own colour, and a square that moves, so frames differ."""
    w, h = size
    img = Image.new("RGB", size, ((40 * i) % 256, (255 - 30 * i) % 256, (90 + 50 * i) % 256))
    x = (i * w // 8) % max(1, w - w // 4)
    ImageDraw.Draw(img).rectangle((x, h // 4, x + w // 4, h // 2), fill=(255, 255, 255))
    return img


def video(seconds: float = 3.0, fps: int = 4, size: tuple[int, int] = (64, 48),
          container: str = "mp4", first: int = 0) -> bytes:
    """A video of ``seconds`` at ``fps``: each second's frames alike (frame ``first`` + the
    second), so sampling at 1 fps sees one colour a second."""
    n = max(1, round(seconds * fps))
    raw = b"".join(frame(first + k // fps, size).tobytes() for k in range(n))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"v.{container}"
        subprocess.run([ffmpeg(), "-nostdin", "-hide_banner", "-loglevel", "error",
                        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{size[0]}x{size[1]}",
                        "-r", str(fps), "-i", "pipe:0", *CODECS[container],
                        "-pix_fmt", "yuvj420p" if container == "avi" else "yuv420p",
                        str(out)], input=raw, check=True, timeout=120)
        return out.read_bytes()


def solid(seconds: float, size: tuple[int, int], fps: int = 1) -> bytes:
    """A long or large video that costs little to make: one colour, from ffmpeg's own source."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "v.mp4"
        subprocess.run([ffmpeg(), "-nostdin", "-hide_banner", "-loglevel", "error", "-f", "lavfi",
                        "-i", f"color=c=teal:size={size[0]}x{size[1]}:rate={fps}",
                        "-t", str(seconds), "-c:v", "mpeg4", str(out)], check=True, timeout=120)
        return out.read_bytes()
