"""A minimal Shorten encoder (format version 2, 16-bit mono, first-order-free ``DIFF0`` blocks
with a fixed Rice parameter), enough to make WSJ-like ``.wv1`` test files that ffmpeg's
Shorten decoder reads back exactly. Compression is not the point; correctness is checked by
decoding in the tests."""

import numpy as np

from cbasr.data.sphere import write_sphere_header


class _Bits:
    def __init__(self):
        self.bits: list[int] = []

    def put(self, value: int, n: int) -> None:
        self.bits += [(value >> i) & 1 for i in range(n - 1, -1, -1)]

    def uvar(self, value: int, k: int) -> None:
        """Rice code: ``value >> k`` zeros, a one, then the low ``k`` bits."""
        self.bits += [0] * (value >> k) + [1]
        self.put(value & ((1 << k) - 1), k)

    def svar(self, value: int, k: int) -> None:
        self.uvar(value << 1 if value >= 0 else ((-value) << 1) - 1, k + 1)

    def ulong(self, value: int) -> None:
        k = value.bit_length()
        self.uvar(k, 2)
        self.uvar(value, k)

    def to_bytes(self) -> bytes:
        bits = self.bits + [0] * (-len(self.bits) % 8)
        return np.packbits(np.array(bits, dtype=np.uint8)).tobytes()


def shorten_stream(samples: np.ndarray, blocksize: int = 256, rice: int = 12) -> bytes:
    """``samples`` (int16) as a Shorten stream: ``ajkg``, version 2, type S16LH, one channel."""
    w = _Bits()
    for byte in b"ajkg":
        w.put(byte, 8)
    w.put(2, 8)  # version
    for value in (
        5,
        1,
        blocksize,
        0,
        0,
        0,
    ):  # type S16LH, channels, block size, maxnlpc, nmean, skip
        w.ulong(value)
    position, size = 0, blocksize
    while position < len(samples):
        block = samples[position : position + size]
        if len(block) < size:  # FN_BLOCKSIZE for the last, short block
            w.uvar(5, 2)
            size = len(block)
            w.ulong(size)
        w.uvar(0, 2)  # FN_DIFF0: samples coded directly
        w.uvar(rice, 3)
        for sample in block.tolist():
            w.svar(int(sample), rice)
        position += size
    w.uvar(4, 2)  # FN_QUIT
    return w.to_bytes()


def write_wv1(path, audio: np.ndarray, rate: int = 16000) -> None:
    """A WSJ-style ``.wv1``: SPHERE header (``pcm,embedded-shorten-v2.00``) + Shorten stream."""
    pcm = np.clip(audio * 32767, -32768, 32767).astype(np.int16)
    header = write_sphere_header(
        len(pcm), rate, "01", coding="pcm,embedded-shorten-v2.00", extra={"database_id": "wsj0"}
    )
    path.write_bytes(header + shorten_stream(pcm))
