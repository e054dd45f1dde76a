"""CRC-32C joined from slices (app.model.crc32c), checked against google_crc32c: any split,
empty parts, slices of one size with a shorter last one."""

from __future__ import annotations

import random

import google_crc32c
import pytest

from app.model.crc32c import Joiner, combine


def crc(data: bytes) -> int:
    return int.from_bytes(google_crc32c.Checksum(data).digest(), "big")


@pytest.mark.parametrize("seed", range(20))
def test_two_parts_combine_into_the_whole(seed):
    rng = random.Random(seed)
    a = rng.randbytes(rng.randint(0, 5000))
    b = rng.randbytes(rng.randint(0, 5000))
    assert combine(crc(a), crc(b), len(b)) == crc(a + b)


@pytest.mark.parametrize(("size", "slice_bytes"), [(0, 64), (1, 64), (64, 64), (1000, 64),
                                                   (100_003, 4096)])
def test_slices_join_in_order_into_the_whole(size, slice_bytes):
    data = random.Random(size).randbytes(size)
    joiner = Joiner()
    for start in range(0, size, slice_bytes):
        part = data[start:start + slice_bytes]
        joiner.add(crc(part), len(part))
    assert joiner.crc == crc(data)


def test_slices_out_of_order_do_not_join_into_the_whole():
    data = random.Random(7).randbytes(300)
    joiner = Joiner()
    for part in (data[100:200], data[:100], data[200:]):
        joiner.add(crc(part), len(part))
    assert joiner.crc != crc(data)
