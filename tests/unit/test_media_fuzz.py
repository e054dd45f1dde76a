"""The image and WAV decoders on mutated files (app.core.media): whatever the bytes, a decode
gives pixels or samples, or a 400 / 413 in the API's shape; never another exception (a 500
with a traceback), whatever Pillow or ``wave`` raise inside.

Each case mutates a small valid file of each format a fixed number of times from a fixed seed
(flipped and overwritten bytes, lengths that lie, cuts, insertions, repeated slices), so a
failure is reproducible from its seed and index.
"""

from __future__ import annotations

import random
import struct

import pytest

from app.base.errors import BadRequest, PayloadTooLarge
from app.core.media import MediaInput, MediaLimits, decode, decode_audio
from tests.support.images import encoded, gif_two_frames, wav

LIMITS = MediaLimits(per_request=2, max_bytes=1 << 20, max_pixels=4_000_000, max_side=64,
                     max_audio_seconds=5.0)
ROUNDS = 600  # mutations per seed and format


def mutate(rng: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:  # flip bits
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and len(b) > 4:  # a 32-bit length or size that lies
            b[i:i + 4] = struct.pack(rng.choice(["<I", ">I"]),
                                     rng.choice([0, 1, 0x7FFFFFF0, 0xFFFFFFFF, rng.getrandbits(32)]))
        elif op == 2:  # cut
            del b[i:]
        elif op == 3:  # insert junk
            b[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 4 and b:  # repeat a slice
            j = min(len(b), i + rng.randint(1, 64))
            b[i:i] = b[i:j] * rng.randint(1, 8)
        elif b:  # overwrite a byte with an extreme value
            b[i] = rng.choice([0, 0xFF, 0x7F, 0x80])
    return bytes(b)


SEEDS = {
    "PNG": encoded((200, 30, 30), (24, 16), "PNG"),
    "JPEG": encoded((30, 200, 30), (24, 16), "JPEG"),
    "WEBP": encoded((30, 30, 200), (24, 16), "WEBP"),
    "GIF": gif_two_frames(),
}


@pytest.mark.parametrize("fmt", sorted(SEEDS))
@pytest.mark.parametrize("seed", [1, 2])
def test_mutated_images_decode_or_are_refused(fmt: str, seed: int) -> None:
    rng = random.Random(f"{fmt}-{seed}")
    refused = 0
    for n in range(ROUNDS):
        raw = mutate(rng, SEEDS[fmt])
        try:
            out = decode(MediaInput(raw, "messages.0.content.1"), LIMITS)
        except (BadRequest, PayloadTooLarge) as exc:
            assert exc.param == "messages.0.content.1", (fmt, seed, n)
            refused += 1
            continue
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"{fmt} seed {seed} #{n}: {type(exc).__name__}: {exc}")
        assert len(out.rgb) == out.width * out.height * 3
    assert refused > 0  # the mutations reach the decoder's error paths


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mutated_wavs_decode_or_are_refused(seed: int) -> None:
    rng = random.Random(f"wav-{seed}")
    base = wav(0.05, 440, 16000, rng.choice([1, 2]), rng.choice([1, 2, 3, 4]))
    refused = 0
    for n in range(ROUNDS):
        raw = mutate(rng, base)
        try:
            out = decode_audio(MediaInput(raw, "m.0", kind="audio"), LIMITS, 16000)
        except (BadRequest, PayloadTooLarge) as exc:
            assert exc.param == "m.0"
            refused += 1
            continue
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"wav seed {seed} #{n}: {type(exc).__name__}: {exc}")
        assert out.samples >= 1
    assert refused > 0
