"""Images are checked before they are decoded (app.core.media): bytes, format by magic,
declared size; then decoded, first frame, scaled down, RGB."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from app.base.errors import BadRequest, PayloadTooLarge
from app.core.media import (
    MediaInput,
    MediaLimits,
    audio_part,
    decode,
    decode_all,
    decode_audio,
    from_url,
    image_part,
    sniff,
)
from tests.support.images import data_url, encoded, gif_two_frames, png_bomb, wav

LIMITS = MediaLimits(per_request=2, max_bytes=1 << 20, max_pixels=4_000_000, max_side=256)


def img(raw: bytes, limits: MediaLimits = LIMITS):
    return decode(MediaInput(raw, "messages.0.content.1"), limits)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_format_decodes_to_rgb(fmt):
    out = img(encoded((200, 10, 10), (40, 30), fmt))
    assert (out.width, out.height) == (40, 30)
    assert len(out.rgb) == 40 * 30 * 3
    r, g, b = out.rgb[:3]
    assert r > 150 and g < 80 and b < 80  # red survives every codec


def test_the_bytes_decide_the_format_not_the_content_type():
    jpeg = encoded("blue", (8, 8), "JPEG")
    assert sniff(jpeg) == "JPEG"
    item = from_url(data_url(jpeg, "image/png"), "p", 1 << 20)  # the URL says png: it is not
    assert img(item.data).width == 8


def test_a_gif_gives_its_first_frame():
    out = img(gif_two_frames())
    assert out.rgb[:3][0] > 200 and out.rgb[:3][2] < 50  # red, not blue


def test_large_images_are_scaled_down_keeping_their_aspect():
    out = img(encoded("green", (1024, 512)))
    assert (out.width, out.height) == (256, 128)


def test_the_digest_names_the_pixels():
    a, b = img(encoded("red", (9, 9))), img(encoded("red", (9, 9), "GIF"))
    assert a.digest == b.digest  # the same pixels however they came
    assert img(encoded("blue", (9, 9))).digest != a.digest
    assert img(encoded("red", (9, 10))).digest != a.digest


def test_a_decompression_bomb_is_refused_from_its_header():
    with pytest.raises(BadRequest) as err:
        img(png_bomb())
    assert err.value.code == "image_too_large" and "50000x50000" in err.value.message
    assert err.value.param == "messages.0.content.1"


@pytest.mark.parametrize("raw, why", [
    (b"", "empty"),
    (b"hello, not an image at all", "not a PNG, JPEG, WebP or GIF"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "cannot be decoded"),  # a PNG's magic, garbage after
    (encoded("red", (32, 32))[:60], "cannot be decoded"),  # cut short
    (b"RIFF\x00\x00\x00\x00WEBPVP8 garbage", "cannot be decoded"),
    (b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64, "not a PNG"),  # a video: never handed on
])
def test_bytes_that_are_no_image_are_a_400(raw, why):
    with pytest.raises(BadRequest) as err:
        img(raw)
    assert why in err.value.message and err.value.code == "invalid_image"


def test_too_many_bytes_is_a_413_before_decoding():
    raw = encoded("red", (8, 8))
    with pytest.raises(PayloadTooLarge):
        img(raw, MediaLimits(2, len(raw) - 1, 10**6, 256))
    with pytest.raises(PayloadTooLarge):  # refused from the base64's length alone
        from_url(data_url(b"x" * 5000), "p", 1024)


def test_too_many_images_name_the_first_one_over():
    items = tuple(MediaInput(encoded("red", (4, 4)), f"m.{i}") for i in range(3))
    with pytest.raises(BadRequest) as err:
        decode_all(items, LIMITS)
    assert err.value.param == "m.2" and err.value.code == "too_many_images"


@pytest.mark.parametrize("url, why", [
    ("data:image/png,rawbytes", "must be base64"),
    ("data:image/png;base64,@@@", "not valid base64"),
    ("https://example.com/" + "x" * 5000, "over 4096 characters"),
])
def test_bad_urls_are_refused(url, why):
    with pytest.raises(BadRequest) as err:
        from_url(url, "p", 1 << 20)
    assert why in err.value.message


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "http://169.254.169.254/latest",
                                 "gs://bucket/cat.png"])
def test_named_images_are_read_only_through_the_fetcher(url):
    item = from_url(url, "p", 1 << 20)
    assert item.url == url and item.data == b""
    with pytest.raises(BadRequest) as err:  # no fetcher: nothing is read
        decode_all((item,), LIMITS)
    assert "not fetched" in err.value.message and err.value.code == "image_url_not_allowed"
    asked = []

    def fetch(u: str, param: str) -> bytes:
        asked.append((u, param))
        return encoded("red", (6, 6))

    limits = MediaLimits(2, 1 << 20, 10**6, 256, fetch=fetch)
    assert decode_all((item,), limits)[0].width == 6 and asked == [(url, "p")]


def test_bare_base64_is_taken_as_llama_server_does():
    raw = encoded("red", (4, 4))
    assert from_url(base64.b64encode(raw).decode(), "p", 1 << 20).data == raw
    # the URL-safe alphabet, unpadded too (Google's SDKs send bytes so)
    safe = base64.urlsafe_b64encode(raw + b"\xfb\xff").decode()
    assert from_url(safe, "p", 1 << 20).data == raw + b"\xfb\xff"
    assert from_url(safe.rstrip("="), "p", 1 << 20).data == raw + b"\xfb\xff"


def test_image_parts_of_both_openai_shapes():
    url = data_url(encoded("red", (4, 4)))
    chat = image_part({"type": "image_url", "image_url": {"url": url, "detail": "low"}}, "m.0", 1 << 20)
    resp = image_part({"type": "input_image", "image_url": url}, "input.0", 1 << 20)
    assert chat.data == resp.data and chat.param == "m.0.image_url.url"
    with pytest.raises(BadRequest) as err:
        image_part({"type": "image_url", "image_url": {}}, "m.0", 1 << 20)
    assert err.value.param == "m.0.image_url.url"


# ---- audio (WAV) --------------------------------------------------------------------------------


def sound(raw: bytes, rate: int = 16000, seconds: float = 60.0):
    return decode_audio(MediaInput(raw, "m.0", kind="audio"),
                        MediaLimits(2, 1 << 22, 10**6, 256, max_audio_seconds=seconds), rate)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2])
def test_wav_of_each_width_and_layout_becomes_mono_float(width, channels):
    out = sound(wav(0.25, 440, 16000, channels, width))
    pcm = np.frombuffer(out.pcm, dtype=np.float32)
    assert out.samples == 4000 and out.rate == 16000
    assert 0.45 < float(np.abs(pcm).max()) < 0.55  # the tone's amplitude, whatever the width


def test_wav_is_resampled_to_the_projectors_rate():
    out = sound(wav(0.5, 440, 44100), rate=16000)
    assert out.samples == 8000 and out.rate == 16000
    assert sound(wav(0.5, 440, 44100)).digest != sound(wav(0.5, 880, 44100)).digest


@pytest.mark.parametrize("raw, code", [
    (b"ID3\x04" + b"\x00" * 200, "invalid_audio"),  # an MP3: not taken
    (b"RIFF\x00\x00\x00\x00WAVEjunk", "invalid_audio"),
    (wav(1.0)[:30], "invalid_audio"),  # cut inside its header
])
def test_sounds_that_are_no_wav_are_a_400(raw, code):
    with pytest.raises(BadRequest) as err:
        sound(raw)
    assert err.value.code == code and err.value.param == "m.0"


def test_too_long_a_sound_is_refused_from_its_header():
    with pytest.raises(BadRequest) as err:
        sound(wav(3.0), seconds=2.0)
    assert err.value.code == "audio_too_long" and "3.0 s" in err.value.message


def test_openai_input_audio_parts():
    b64 = base64.b64encode(wav(0.1)).decode()
    item = audio_part({"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}},
                      "messages.0.content.1", 1 << 20)
    assert item.kind == "audio" and item.param == "messages.0.content.1.input_audio.data"
    with pytest.raises(BadRequest) as err:
        audio_part({"type": "input_audio", "input_audio": {"data": b64, "format": "mp3"}},
                   "m", 1 << 20)
    assert err.value.param == "m.input_audio.format"


def wav_with_lying_chunk() -> bytes:
    """A WAV whose LIST chunk claims 2 GB more than the file holds: ``wave`` raises a bare
    RuntimeError on it (security3 L3), which must be a 400 like every other decoder error."""
    import struct

    body = wav(0.1)[12:]
    lie = b"LIST" + struct.pack("<I", 0x7FFFFFF0) + b"INFOabcd"
    return b"RIFF" + struct.pack("<I", 4 + len(lie) + len(body)) + b"WAVE" + lie + body


def test_a_chunk_that_lies_about_its_size_is_a_400():
    with pytest.raises(BadRequest) as err:
        sound(wav_with_lying_chunk())
    assert err.value.code == "invalid_audio" and "RuntimeError" in err.value.message


# ---- the decode budget (IMAGE_DECODE_BUDGET) ---------------------------------------------------


def rgba_png(side: int) -> bytes:
    """A PNG of ``side`` x ``side`` transparent pixels: a few KB that decode to 4 bytes a pixel
    plus an RGB copy (the review's 7000 x 7000 one was 186 KB and 340 MB decoded)."""
    import io

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGBA", (side, side)).save(buf, "PNG")
    return buf.getvalue()


def test_a_decode_holds_its_estimated_bytes_while_it_runs():
    from app.core.decode_budget import DecodeBudget, decode_cost

    budget = DecodeBudget(1 << 30, wait=1.0)
    limits = MediaLimits(2, 1 << 22, 10**8, 256, budget=budget)
    out = decode(MediaInput(rgba_png(1500), "p"), limits)
    assert (out.width, out.height) == (256, 256)
    assert budget.peak == decode_cost("RGBA", 1500, 1500) == 1500 * 1500 * 8
    assert budget.used == 0  # given back


def test_concurrent_decodes_never_hold_more_than_the_budget():
    """Six large images decoded at once on six threads, as the prep pool would: the bytes in
    flight stay within the budget (one and a half images' worth), and every image decodes."""
    import threading

    from app.core.decode_budget import DecodeBudget, decode_cost

    cost = decode_cost("RGBA", 1500, 1500)
    budget = DecodeBudget(cost * 3 // 2, wait=60.0)
    limits = MediaLimits(2, 1 << 22, 10**8, 256, budget=budget)
    raw, results, errors = rgba_png(1500), [], []

    def run():
        try:
            results.append(decode(MediaInput(raw, "p"), limits))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 6
    assert budget.peak == cost  # one at a time: two would not fit
    assert budget.used == 0


def test_past_the_budget_a_decode_waits_then_is_a_429():
    from app.base.errors import QueueFull
    from app.core.decode_budget import DecodeBudget

    budget = DecodeBudget(1 << 24, wait=0.05)
    limits = MediaLimits(2, 1 << 22, 10**8, 256, budget=budget)
    with budget.hold(1 << 24, "a"), pytest.raises(QueueFull) as err:  # another decode holds it all
        decode(MediaInput(rgba_png(300), "messages.0.content.1"), limits)
    assert err.value.param == "messages.0.content.1"
    assert "IMAGE_DECODE_BUDGET" in err.value.message
    assert budget.used == 0
    # and one image larger than the whole budget still decodes, alone
    assert decode(MediaInput(rgba_png(1500), "p"), limits).width == 256
