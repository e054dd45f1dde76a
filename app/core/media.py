"""Images from requests, decoded here and nowhere else.

Every API hands over an image's bytes (a ``data:`` URL's, base64 decoded). This module checks
them before any pixel is decoded, in this order: the byte count, the format by its magic bytes
(PNG, JPEG, WebP, GIF: a content type that lies does not matter, the bytes decide), then the
dimensions the header declares (a 100-byte PNG can claim 50000 x 50000: refused before it
inflates). Only then does Pillow decode it (a GIF's first frame), and an image larger than the
projector needs is scaled down, as llama-server does, so a large photo costs no more than a
small one. libmtmd gets RGB pixels: its own decoders, and the ffmpeg it falls back to for bytes
they cannot read, never see client bytes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import re
import wave
from collections.abc import Callable
from dataclasses import dataclass, replace

from app.base.errors import BadRequest, PayloadTooLarge, QueueFull
from app.core import video
from app.core.decode_budget import DecodeBudget, decode_cost
from app.engine.types import MEDIA, Audio, Image

# magic bytes -> format (Pillow's name)
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
)
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?(;[\w-]+=[\w.+-]+)*;base64,", re.ASCII)


@dataclass(frozen=True)
class MediaLimits:
    """IMAGES_PER_REQUEST, IMAGE_MAX_BYTES, IMAGE_MAX_PIXELS and IMAGE_MAX_SIDE; ``fetch``
    reads an image a request names by URL (app.model.remote: only where the operator allows)."""

    per_request: int
    max_bytes: int
    max_pixels: int
    max_side: int
    fetch: Callable[[str, str], bytes] | None = None
    max_audio_seconds: float = 60.0  # AUDIO_MAX_SECONDS
    budget: DecodeBudget | None = None  # IMAGE_DECODE_BUDGET: the worker's, shared by requests
    video: video.VideoLimits = video.VideoLimits()  # VIDEO_*: how frames are taken
    fetch_video: Callable[[str, str], bytes] | None = None  # ``fetch`` held to VIDEO_MAX_BYTES


@dataclass(frozen=True)
class MediaInput:
    """An image as a request sent it: its bytes, or the gs:// or http(s) URL to read them
    from (when the plan is made, off the request's thread), and the field it came in."""

    data: bytes
    param: str
    url: str = ""
    kind: str = "image"  # or "audio", "video"
    clip: video.Clip | None = None  # a video's part to take (Gemini's videoMetadata)


def from_url(url: str, param: str, max_bytes: int, kind: str = "image") -> MediaInput:
    """An image part's URL: a base64 ``data:`` URL (or bare base64, as llama-server takes),
    or a gs:// or http(s) URL, read later if the operator allows it (``MediaLimits.fetch``).
    ``kind``: what it holds (a video's bytes are VIDEO_MAX_BYTES at most)."""
    what = "video" if kind == "video" else "image"
    if url.startswith(("http://", "https://", "gs://")):
        if len(url) > 4096:
            raise BadRequest(f"{what} URL is over 4096 characters", param=param,
                             code=f"invalid_{what}")
        return MediaInput(b"", param, url, kind)
    m = _DATA_URL.match(url)
    if url.startswith("data:") and m is None:
        raise BadRequest(f"an {what} data: URL must be base64: data:{what}/"
                         f"{'mp4' if kind == 'video' else 'png'};base64,...",
                         param=param, code=f"invalid_{what}")
    payload = url[m.end():] if m else url
    # base64 is 4 characters per 3 bytes: a body past the limit is refused before decoding
    if len(payload) > (max_bytes + 2) // 3 * 4 + 4:
        setting = "VIDEO_MAX_BYTES" if kind == "video" else "IMAGE_MAX_BYTES"
        raise PayloadTooLarge(f"{what} is over {max_bytes} bytes ({setting})", param=param)
    try:
        if "-" in payload or "_" in payload:  # the URL-safe alphabet (Google's SDKs send it)
            data = base64.b64decode(payload + "=" * (-len(payload) % 4), altchars=b"-_",
                                    validate=True)
        else:
            data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what} is not valid base64", param=param,
                         code=f"invalid_{what}") from None
    return MediaInput(data, param, kind=kind)


class Collected:
    """A request's images, in the order its parser meets them; ``take`` returns the MEDIA mark
    that stands for each in its turn's text."""

    def __init__(self, max_bytes: int, video_max_bytes: int = 64 << 20):
        self.max_bytes = max_bytes
        self.video_max_bytes = video_max_bytes
        self.items: list[MediaInput] = []

    def take(self, url: str, param: str) -> str:
        """An image given as a data: URL, bare base64, or a gs:// or http(s) URL."""
        self.items.append(from_url(url, param, self.max_bytes))
        return MEDIA

    def part(self, part: dict, param: str) -> str:
        """An OpenAI image part (image_part), audio part (audio_part) or video part
        (video_part)."""
        kind = part.get("type")
        if kind in VIDEO_PARTS:
            self.items.append(video_part(part, param, self.video_max_bytes))
            return MEDIA
        read = audio_part if kind == "input_audio" else image_part
        self.items.append(read(part, param, self.max_bytes))
        return MEDIA

    def take_video(self, url: str, param: str, clip: video.Clip | None = None) -> str:
        """A video given as a data: URL, bare base64, or a gs:// or http(s) URL; ``clip``:
        the part of it to take."""
        item = from_url(url, param, self.video_max_bytes, "video")
        self.items.append(replace(item, clip=clip) if clip else item)
        return MEDIA

    def take_audio(self, data: str, param: str) -> str:
        """A sound given as base64 (or a URL), WAV."""
        item = from_url(data, param, self.max_bytes)
        self.items.append(MediaInput(item.data, item.param, item.url, kind="audio"))
        return MEDIA


def audio_part(part: dict, param: str, max_bytes: int) -> MediaInput:
    """OpenAI's ``{"type": "input_audio", "input_audio": {"data": base64, "format": "wav"}}``
    (WAV only: a format this server decodes itself)."""
    audio = part.get("input_audio")
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise BadRequest("an input_audio part needs input_audio.data (base64)",
                         param=f"{param}.input_audio.data", code="invalid_audio")
    fmt = audio.get("format", "wav")
    if fmt != "wav":
        raise BadRequest(f"audio format {fmt!r} is not taken: send WAV", code="invalid_audio",
                         param=f"{param}.input_audio.format")
    item = from_url(audio["data"], f"{param}.input_audio.data", max_bytes)
    return MediaInput(item.data, item.param, item.url, kind="audio")


# the video parts: vLLM's ``{"type": "video_url", "video_url": {"url"}}`` and llama-server's
# ``{"type": "input_video", "input_video": {"data": base64} | {"url"} | base64}``
VIDEO_PARTS = frozenset({"video_url", "input_video"})


def video_part(part: dict, param: str, max_bytes: int) -> MediaInput:
    """A video part (VIDEO_PARTS): its URL or base64, as ``from_url`` takes them."""
    kind = part.get("type")
    value, at = part.get(kind), f"{param}.{kind}"
    if isinstance(value, dict):
        key = "url" if kind == "video_url" or "url" in value else "data"
        value, at = value.get(key), f"{at}.{key}"
    if not isinstance(value, str) or not value:
        raise BadRequest(f"a {kind} part needs its video as a URL or base64 string (a data: "
                         "URL)", param=at, code="invalid_video")
    return from_url(value, at, max_bytes, "video")


def image_part(part: dict, param: str, max_bytes: int) -> MediaInput:
    """An OpenAI image part: Chat Completions' ``{"type": "image_url", "image_url": {"url"}}``
    (a bare string URL too) or Responses' ``{"type": "input_image", "image_url": "..."}``."""
    url = part.get("image_url")
    if isinstance(url, dict):
        url, param = url.get("url"), f"{param}.image_url.url"
    else:
        param = f"{param}.image_url"
    if not isinstance(url, str) or not url:
        raise BadRequest("an image part needs its image as a URL string (a data: URL)",
                         param=param, code="invalid_image")
    return from_url(url, param, max_bytes)


def sniff(data: bytes) -> str | None:
    """The image format the bytes start with, or None."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def decode(item: MediaInput, limits: MediaLimits) -> Image:
    """The image's RGB pixels, scaled down to ``max_side``; BadRequest for anything else."""
    from PIL import Image as PILImage  # imported on first use: most servers see no image

    # the size check below (IMAGE_MAX_PIXELS, from the header) replaces Pillow's own, which
    # would refuse a large image with a less useful message
    PILImage.MAX_IMAGE_PIXELS = None

    data, param = item.data, item.param
    if not data:
        raise BadRequest("image is empty", param=param, code="invalid_image")
    if len(data) > limits.max_bytes:
        raise PayloadTooLarge(
            f"image is {len(data)} bytes, over {limits.max_bytes} (IMAGE_MAX_BYTES)", param=param)
    fmt = sniff(data)
    if fmt is None:
        raise BadRequest("image is not a PNG, JPEG, WebP or GIF (judged by its bytes)",
                         param=param, code="invalid_image")
    try:
        img = PILImage.open(io.BytesIO(data), formats=[fmt])  # reads the header only
        width, height = img.size
        if width < 1 or height < 1 or width * height > limits.max_pixels:
            raise BadRequest(
                f"image is {width}x{height} pixels, over {limits.max_pixels} "
                "(IMAGE_MAX_PIXELS)", param=param, code="image_too_large")
        img.seek(0)  # an animation's first frame
        img.draft("RGB", (limits.max_side, limits.max_side))  # JPEG: decode at a lower scale
        with _held(limits.budget, decode_cost(img.mode, *img.size), param):
            rgb = img.convert("RGB")
            if max(rgb.size) > limits.max_side:
                rgb.thumbnail((limits.max_side, limits.max_side), PILImage.Resampling.BICUBIC)
            pixels = rgb.tobytes()
    except (BadRequest, QueueFull):
        raise
    except Exception as exc:  # noqa: BLE001  (client bytes: whatever a decoder raises is a 400)
        raise BadRequest(f"image cannot be decoded ({fmt}): {type(exc).__name__}",
                         param=param, code="invalid_image") from None
    w, h = rgb.size
    digest = hashlib.sha256(b"%dx%d:" % (w, h) + pixels).hexdigest()
    return Image(pixels, w, h, digest)


def decode_all(items: tuple[MediaInput, ...], limits: MediaLimits, audio_rate: int = 0
               ) -> tuple[Image | Audio | tuple[Image, ...], ...]:
    """Every image (and sound, and video) of a request, each read (if named by URL) and
    decoded; sound at ``audio_rate``, the projector's; a video as its frames."""
    if len(items) > limits.per_request:
        raise BadRequest(f"{len(items)} images in one request: at most {limits.per_request} "
                         "(IMAGES_PER_REQUEST)", param=items[limits.per_request].param,
                         code="too_many_images")
    out: list[Image | Audio | tuple[Image, ...]] = []
    frames_left = limits.video.max_frames  # shared by the request's videos
    for item in items:
        if item.kind == "audio":
            out.append(decode_audio(_fetched(item, limits), limits, audio_rate))
        elif item.kind == "video":
            if frames_left <= 0:
                raise BadRequest(f"the request's videos already gave {limits.video.max_frames} "
                                 "frames (VIDEO_MAX_FRAMES, for all of a request's videos)",
                                 param=item.param, code="too_many_frames")
            frames = decode_video(_fetched(item, limits), limits, frames_left)
            frames_left -= len(frames)
            out.append(frames)
        else:
            out.append(decode(_fetched(item, limits), limits))
    return tuple(out)


def decode_video(item: MediaInput, limits: MediaLimits, max_frames: int | None = None
                 ) -> tuple[Image, ...]:
    """A video's frames (app.core.video extracts them, as PNG: at most ``max_frames``), each
    then decoded as an image is: the same checks, the same pixels for the same frame, so a
    repeated video finds each frame in the projector's cache. The extraction holds the
    child's memory (its address space and its frames' file) in the worker's decode budget
    (IMAGE_DECODE_BUDGET): a burst of videos waits its turn, or is a 429, as images are."""
    vlimits = limits.video if max_frames is None else replace(
        limits.video, max_frames=min(max_frames, limits.video.max_frames))
    # the child's resident memory is about half its address-space cap (docs/video.md), and
    # its frames' file can be on a tmpfs
    hold = (limits.budget.hold(vlimits.memory // 2 + video.out_limit(vlimits), item.param)
            if limits.budget is not None else contextlib.nullcontext())
    with hold:
        frames = video.extract(item.data, vlimits, item.param, item.clip)
    # a frame is this server's own PNG, bounded by VIDEO_MAX_SIDE: IMAGE_MAX_BYTES is for
    # clients' files, and a small one must not refuse frames
    as_image = replace(limits, max_bytes=max(limits.max_bytes, video.out_limit(limits.video)))
    return tuple(decode(MediaInput(frame, item.param), as_image) for frame in frames)


def decode_audio(item: MediaInput, limits: MediaLimits, rate: int) -> Audio:
    """A WAV file's samples, mixed to mono and resampled to ``rate``: PCM of 8, 16, 24 or 32
    bits, at most AUDIO_MAX_SECONDS long (read from its header before its samples)."""
    import numpy as np

    data, param = item.data, item.param
    if len(data) > limits.max_bytes:
        raise PayloadTooLarge(
            f"audio is {len(data)} bytes, over {limits.max_bytes} (IMAGE_MAX_BYTES)", param=param)
    if not (len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE"):
        raise BadRequest("audio is not a WAV file (judged by its bytes)", param=param,
                         code="invalid_audio")
    try:
        with wave.open(io.BytesIO(data)) as wav:
            channels, width, src_rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.getnframes()
            if not (1 <= channels <= 8 and width in (1, 2, 3, 4) and 1000 <= src_rate <= 384000):
                raise BadRequest(f"audio of {channels} channels, {8 * width} bits at "
                                 f"{src_rate} Hz is not taken", param=param, code="invalid_audio")
            seconds = frames / src_rate
            if seconds > limits.max_audio_seconds:
                raise BadRequest(f"audio is {seconds:.1f} s long, over {limits.max_audio_seconds:g} "
                                 "(AUDIO_MAX_SECONDS)", param=param, code="audio_too_long")
            raw = wav.readframes(frames)
    except BadRequest:
        raise
    except Exception as exc:  # noqa: BLE001  (wave raises RuntimeError, struct.error and more)
        why = str(exc) if isinstance(exc, wave.Error) else type(exc).__name__
        raise BadRequest(f"audio cannot be decoded (WAV): {why}", param=param,
                         code="invalid_audio") from None
    if width == 3:  # 24-bit: widen to 32
        b = np.frombuffer(raw[: len(raw) // 3 * 3], dtype=np.uint8).reshape(-1, 3)
        raw = np.pad(b, ((0, 0), (1, 0))).tobytes()
        width = 4
    kind = {1: np.uint8, 2: np.int16, 4: np.int32}[width]
    samples = np.frombuffer(raw[: len(raw) // width * width], dtype=kind).astype(np.float32)
    if width == 1:
        samples = (samples - 128.0) / 128.0
    else:
        samples /= float(2 ** (8 * width - 1))
    samples = samples[: len(samples) // channels * channels].reshape(-1, channels).mean(axis=1)
    if samples.size == 0:
        raise BadRequest("audio holds no samples", param=param, code="invalid_audio")
    if rate and src_rate != rate:  # linear resampling: enough for speech encoders' 16 kHz
        n = max(1, round(samples.size * rate / src_rate))
        samples = np.interp(np.linspace(0, samples.size - 1, n), np.arange(samples.size), samples)
    pcm = samples.astype(np.float32).tobytes()
    return Audio(pcm, len(pcm) // 4, rate or src_rate,
                 hashlib.sha256(b"audio:%d:" % (rate or src_rate) + pcm).hexdigest())


def _held(budget: DecodeBudget | None, cost: int, param: str):
    """The decode's share of IMAGE_DECODE_BUDGET (none where no budget is set: unit tests)."""
    return budget.hold(cost, param) if budget is not None else contextlib.nullcontext()


def _fetched(item: MediaInput, limits: MediaLimits) -> MediaInput:
    if not item.url:
        return item
    fetch = limits.fetch_video if item.kind == "video" else limits.fetch
    if fetch is None:
        raise BadRequest("image URLs are not fetched by this server: send the image inline as "
                         "a data: URL (data:image/png;base64,...)", param=item.param,
                         code="image_url_not_allowed")
    return replace(item, data=fetch(item.url, item.param), url="")
