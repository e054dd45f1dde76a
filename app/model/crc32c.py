"""CRC-32C of a whole object from its slices' CRCs, so a sliced download is verified as its
bytes arrive instead of by reading the finished file again (4.7 GB read back serially after
the last slice, on the way to ready).

``combine(crc_a, crc_b, len_b)`` is the CRC of A followed by B, zlib's ``crc32_combine`` method
for the Castagnoli polynomial: A's CRC carried over ``len_b`` zero bytes by an operator on
GF(2)^32, then B's added. Slices of one size share that operator, so joining hundreds of them
costs one matrix product each (``Joiner``).
"""

from __future__ import annotations

POLY = 0x82F63B78  # Castagnoli, reflected

Matrix = list[int]  # 32 columns, each a 32-bit vector


def _times(mat: Matrix, vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _product(a: Matrix, b: Matrix) -> Matrix:
    """The operator ``a`` after ``b``."""
    return [_times(a, col) for col in b]


def zeros_operator(n_bytes: int) -> Matrix:
    """The operator that carries a CRC over ``n_bytes`` zero bytes."""
    one_bit = [POLY] + [1 << k for k in range(31)]
    byte = one_bit
    for _ in range(3):  # 8 zero bits
        byte = _product(byte, byte)
    result: Matrix = [1 << k for k in range(32)]  # identity
    power = byte
    while n_bytes:
        if n_bytes & 1:
            result = _product(power, result)
        n_bytes >>= 1
        if n_bytes:
            power = _product(power, power)
    return result


def combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """The CRC-32C of A then B, from their CRCs and B's length."""
    return _times(zeros_operator(len_b), crc_a) ^ crc_b if len_b else crc_a


class Joiner:
    """Slices' CRCs joined in order, the operator of each length made once."""

    def __init__(self) -> None:
        self.crc = 0  # the CRC of nothing
        self._ops: dict[int, Matrix] = {}

    def add(self, crc: int, length: int) -> None:
        if not length:
            return
        op = self._ops.get(length)
        if op is None:
            op = self._ops[length] = zeros_operator(length)
        self.crc = _times(op, self.crc) ^ crc
