"""NIST SPHERE headers: reading them to check a file, and writing them for test corpora.

A SPHERE file starts with an ASCII header of ``header_size`` bytes (1024 in TIMIT and WSJ)::

    NIST_1A
       1024
    sample_count -i 46797
    sample_rate -i 16000
    sample_n_bytes -i 2
    sample_byte_format -s2 01
    sample_coding -s26 pcm,embedded-shorten-v2.00
    end_head

then the samples: raw PCM (``sample_byte_format`` ``01`` little-endian, ``10`` big-endian) or a
Shorten stream (WSJ's ``.wv1``).
"""

from pathlib import Path

__all__ = ["SphereError", "read_header", "is_shorten", "expected_pcm_bytes", "write_sphere_header"]


class SphereError(ValueError):
    """A file that is not a readable SPHERE file; the message names it."""


def read_header(path: str | Path) -> dict:
    """The header fields of a SPHERE file (ints as int), plus ``header_size``.

    Raises:
        SphereError: no ``NIST_1A`` magic, a damaged header, or no ``end_head``.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(16)
        if not head.startswith(b"NIST_1A"):
            raise SphereError(f"{path}: not a NIST SPHERE file (no NIST_1A header)")
        try:
            size = int(head[8:16].split()[0])
        except (ValueError, IndexError) as e:
            raise SphereError(f"{path}: damaged SPHERE header size") from e
        f.seek(0)
        text = f.read(size).decode("ascii", errors="replace")
    fields: dict = {"header_size": size}
    for line in text.splitlines()[2:]:
        parts = line.split(None, 2)
        if not parts:
            continue
        if parts[0] == "end_head":
            return fields
        if len(parts) == 3:
            key, kind, value = parts
            fields[key] = int(value) if kind == "-i" else value.strip()
    raise SphereError(f"{path}: SPHERE header has no end_head within {size} bytes")


def is_shorten(header: dict) -> bool:
    return "shorten" in str(header.get("sample_coding", ""))


def expected_pcm_bytes(header: dict) -> int | None:
    """The file size an uncompressed SPHERE file must have, or None if the header cannot say."""
    if is_shorten(header) or "sample_count" not in header:
        return None
    return header["header_size"] + header["sample_count"] * header.get(
        "sample_n_bytes", 2
    ) * header.get("channel_count", 1)


def write_sphere_header(
    sample_count: int,
    sample_rate: int = 16000,
    byte_format: str = "01",
    coding: str | None = None,
    extra: dict | None = None,
    size: int = 1024,
) -> bytes:
    """A SPHERE header of ``size`` bytes (space padded), as TIMIT and WSJ files carry."""
    lines = ["NIST_1A", f"{size:7d}"]
    fields = {
        "database_id": ("-s5", "TIMIT"),
        "channel_count": ("-i", 1),
        "sample_count": ("-i", sample_count),
        "sample_rate": ("-i", sample_rate),
        "sample_n_bytes": ("-i", 2),
        "sample_byte_format": (f"-s{len(byte_format)}", byte_format),
        "sample_sig_bits": ("-i", 16),
    }
    if coding:
        fields["sample_coding"] = (f"-s{len(coding)}", coding)
    for key, value in (extra or {}).items():
        fields[key] = ("-i", value) if isinstance(value, int) else (f"-s{len(str(value))}", value)
    lines += [f"{key} {kind} {value}" for key, (kind, value) in fields.items()]
    lines.append("end_head")
    text = "\n".join(lines) + "\n"
    if len(text) > size:
        raise ValueError(f"SPHERE header needs {len(text)} > {size} bytes")
    return text.encode("ascii") + b" " * (size - len(text))
