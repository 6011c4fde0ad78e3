"""Emission delay: when each correctly recognised unit reaches the user, against when it was
actually spoken.

A decoding writes ``timing.tsv`` beside ``hyp.trn``: per utterance, the gold end time of each
reference token (where the corpus has one: the digits corpus's ``word_ends``; for phones, the
start of the next phone, ``phone_starts``, so a phone's end takes in any pause after it and the
utterance's last phone has none) and the time each hypothesis token was emitted. A streaming
transducer's token is emitted once the encoder block (a chunk, or a recurrent encoder's frame)
of the frame that emitted it has been computed, i.e. once the audio that block reads has
arrived; an offline system (a full-context encoder, or any beam search) emits every token at
the utterance's end. :func:`emission_delays` pairs the tokens the alignment of the error rate
marks correct and returns ``emitted - gold end`` of each; :func:`delay_summary` their median
and 90th percentile, as ``cbasr-score`` and ``cbasr-compare`` report them
(``emission_delay_p50_ms``, ``emission_delay_p90_ms``).
"""

from pathlib import Path

import numpy as np

from cbasr.storage.files import write_text

__all__ = [
    "TIMING_FILE",
    "gold_ends",
    "write_timing",
    "read_timing",
    "emission_delays",
    "delay_summary",
]

TIMING_FILE = "timing.tsv"
_UNKNOWN = "-"


def gold_ends(record: dict, units: str, tokens: int) -> list[float | None] | None:
    """The gold end time (seconds) of each of the ``tokens`` reference tokens of ``record`` in
    ``units``, None for a token without one; None if the record has no times for them."""
    if units == "words" and record.get("word_ends") is not None:
        ends = list(record["word_ends"])
    elif units in ("phones", "phones_full") and record.get("phone_starts") is not None:
        ends = list(record["phone_starts"][1:]) + [None]
    else:
        return None
    return ends if len(ends) == tokens else None


def write_timing(
    path: str | Path, rows: list[tuple[str, list[float | None] | None, list[float]]]
) -> None:
    """``id<TAB>gold ends<TAB>emission times`` per utterance (seconds, space-separated; ``-``
    for a token without a gold end, an empty field for an utterance without any)."""

    def seconds(values) -> str:
        return " ".join(_UNKNOWN if v is None else f"{v:.4f}" for v in values)

    lines = ["id\tgold_ends\temitted\n"]
    for utt_id, ends, emitted in rows:
        lines.append(f"{utt_id}\t{'' if ends is None else seconds(ends)}\t{seconds(emitted)}\n")
    write_text(path, "".join(lines))


def read_timing(path: str | Path) -> dict[str, tuple[list[float | None] | None, list[float]]]:
    """:func:`write_timing`'s rows by utterance id."""

    def values(field: str) -> list:
        return [None if v == _UNKNOWN else float(v) for v in field.split()]

    rows = {}
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        if len(parts) != 3:
            raise ValueError(f"{path}:{lineno}: expected id, gold ends and emission times")
        utt_id, ends, emitted = parts
        rows[utt_id] = (values(ends) if ends else None, values(emitted))
    return rows


def emission_delays(
    alignment: list[tuple[str, str | None, str | None]],
    ends: list[float | None],
    emitted: list[float],
) -> list[float]:
    """``emitted - gold end`` (seconds) of every correct token of ``alignment`` (the error
    rate's, :func:`~cbasr.evaluation.scoring.align_tokens`) whose reference token has a gold
    end; ``ends`` is indexed by reference token, ``emitted`` by hypothesis token."""
    delays, r, h = [], 0, 0
    for op, _, _ in alignment:
        if op == "C" and ends[r] is not None:
            delays.append(emitted[h] - ends[r])
        r += op != "I"
        h += op != "D"
    return delays


def delay_summary(delays: list[float]) -> dict:
    """``{"p50_ms", "p90_ms", "units"}`` of delays in seconds (None without any)."""
    if not delays:
        return {"p50_ms": None, "p90_ms": None, "units": 0}
    p50, p90 = np.percentile(np.asarray(delays, dtype=np.float64), [50, 90])
    return {"p50_ms": 1000.0 * float(p50), "p90_ms": 1000.0 * float(p90), "units": len(delays)}
