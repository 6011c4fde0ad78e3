"""``decode.json``, read in one place: what a decoding directory records about how it was made.

:func:`cbasr.inference.decode.decode_split` writes it; the up-to-date check, scoring and the
comparison tables read it through :class:`DecodeInfo`. A decoding written before a field
existed reads with that field's default: the first format had ``search`` and no ``settings``
(read as ``{"search": <search>}``), and no ``parameters`` (None), ``failed``, ``empty_refs``
or ``oov_ref_utts`` (0), ``checkpoint_stamp`` or ``data`` (None: never up to date), and no
``emission`` (None: no ``timing.tsv``).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DecodeInfo"]


@dataclass(frozen=True)
class DecodeInfo:
    """The fields of ``decode.json`` that other code reads (``raw``: all of them)."""

    checkpoint: str = "best"
    epoch: int | None = None
    settings: dict = field(default_factory=lambda: {"search": "greedy"})
    units: str = ""
    skipped: int = 0  # utterances left out of the score (decodings before failures were scored)
    failed: int = 0  # utterances without features, scored as empty hypotheses
    empty_refs: int = 0
    oov_ref_utts: int = 0
    parameters: int | None = None
    rtf: float | None = None
    checkpoint_stamp: str | None = None
    data: dict | None = None
    emission: str | None = None  # "streaming" or "utterance end" (cbasr.evaluation.delay)
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, info: dict) -> "DecodeInfo":
        return cls(
            checkpoint=info.get("checkpoint", "best"),
            epoch=info.get("epoch"),
            settings=info.get("settings", {"search": info.get("search", "greedy")}),
            units=info.get("units", ""),
            skipped=info.get("skipped", 0),
            failed=info.get("failed", 0),
            empty_refs=info.get("empty_refs", 0),
            oov_ref_utts=info.get("oov_ref_utts", 0),
            parameters=info.get("parameters"),
            rtf=info.get("rtf"),
            checkpoint_stamp=info.get("checkpoint_stamp"),
            data=info.get("data"),
            emission=info.get("emission"),
            raw=info,
        )

    @classmethod
    def read(cls, decode_dir: str | Path) -> "DecodeInfo | None":
        """``decode_dir``'s record, or None where it has no ``decode.json``."""
        path = Path(decode_dir) / "decode.json"
        return cls.from_json(json.loads(path.read_text())) if path.is_file() else None
