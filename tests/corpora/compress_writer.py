"""A Unix ``compress`` (``.Z``) writer for fake corpora: every byte a literal 9-bit code.

It does not compress (no LZW dictionary is used), but its output is a valid ``.Z`` stream that
``uncompress``, ``gzip -d`` and ``unlzw3`` decode: block mode, codes packed least significant
bit first, and a CLEAR code after every 247 literals so that the decoder's dictionary never
outgrows 9-bit codes (247 literals and a CLEAR are 248 codes: a whole number of the 8-code
groups the decoder aligns to after a CLEAR).
"""

CLEAR = 256
_RUN = 247


def compress_bytes(data: bytes) -> bytes:
    codes = []
    for start in range(0, len(data), _RUN):
        if start:
            codes.append(CLEAR)
        codes.extend(data[start : start + _RUN])
    bits = 0
    value = 0
    out = bytearray(b"\x1f\x9d\x90")  # magic, block mode with at most 16-bit codes
    for code in codes:
        value |= code << bits
        bits += 9
        while bits >= 8:
            out.append(value & 0xFF)
            value >>= 8
            bits -= 8
    if bits:
        out.append(value & 0xFF)
    return bytes(out)
