"""Images for the vision tests, made here with Pillow: real files of each format, and hostile
ones (a PNG whose header claims 50000 x 50000 pixels, bytes that only look like an image)."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def encoded(color: str | tuple[int, int, int], size: tuple[int, int] = (64, 48),
            fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def gif_two_frames() -> bytes:
    """A GIF whose first frame is red and second blue."""
    buf = io.BytesIO()
    frames = [Image.new("RGB", (16, 16), c) for c in ("red", "blue")]
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    return buf.getvalue()


def png_bomb(width: int = 50000, height: int = 50000) -> bytes:
    """A valid PNG header claiming ``width`` x ``height`` pixels, with a few bytes of data:
    decoding it would inflate to gigabytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 1024)) + chunk(b"IEND", b""))


def wav(seconds: float = 1.0, freq: float = 440.0, rate: int = 16000, channels: int = 1,
        width: int = 2) -> bytes:
    """A WAV file of a sine tone (PCM, ``width`` bytes a sample, the same on each channel)."""
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    tone = np.sin(2 * np.pi * freq * t) * 0.5
    full = float(2 ** (8 * width - 1) - 1)
    if width == 1:
        frames = (tone * 127 + 128).astype(np.uint8).tobytes()
    elif width == 3:
        ints = (tone * full).astype("<i4")
        frames = b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints)
    else:
        frames = (tone * full).astype({2: "<i2", 4: "<i4"}[width]).tobytes()
    per = len(frames) // len(t)
    interleaved = b"".join(frames[i * per:(i + 1) * per] * channels for i in range(len(t)))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(interleaved)
    return buf.getvalue()
