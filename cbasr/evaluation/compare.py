"""One table across experiments: error rates with bootstrap intervals, S/D/I, model size,
training epochs and time, decode settings, dev alignment accuracy, the deletions of repeated
and other reference tokens, and paired significance tests between two systems.

A *system* is one decoding directory ``<exp>/decode/<name>`` (a split, decoded greedily or with
some search), labelled ``<experiment name>:<name>``. Its per-utterance error counts come from
``per_utt.tsv`` (written by ``cbasr-score``) or, for older decodings, from the trn files; its
repeat counts (:func:`cbasr.evaluation.scoring.repeat_deletion_counts`) from ``score.json``, or
from the trn files with the error counts (none for a ``score.json`` older than them).
"""

import csv
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cbasr.evaluation.decode_info import DecodeInfo
from cbasr.evaluation.scoring import (
    REPEAT_KEYS,
    bootstrap_interval,
    check_score_is_current,
    paired_bootstrap_test,
    read_trn,
    sign_test,
    utterance_counts,
)

__all__ = [
    "System",
    "collect_systems",
    "comparison_rows",
    "markdown_table",
    "csv_table",
    "paired_comparison",
    "find_systems",
    "describe_settings",
]


@dataclass
class System:
    """A scored decoding directory and what it needs in the table."""

    label: str
    exp_dir: Path
    decode_dir: Path
    info: DecodeInfo  # decode.json (the defaults if missing)
    errors: dict[str, int] = field(default_factory=dict)  # utterance -> S + D + I
    # utterance -> {sub, del, ins, ref_tokens}
    counts: dict[str, dict] = field(default_factory=dict)
    epochs: int | None = None
    parameters: int | None = None
    train_seconds: float | None = None  # sum of the epoch times in history.json
    alignment: dict = field(default_factory=dict)  # align/dev/alignment.json (empty if missing)
    # {repeat_deletions, repeat_tokens, other_deletions, other_tokens}; None: not counted
    repeats: dict[str, int] | None = None
    # score.json's emission delay {p50_ms, p90_ms, units, emission}; None: not measured
    delay: dict | None = None


def describe_settings(settings: dict) -> str:
    """A short human description of ``decode.json``'s settings: ``greedy`` or ``beam 8, lm 0.5 (lm.arpa)``."""
    if not settings or settings.get("search", "greedy") == "greedy":
        return "greedy"
    parts = [f"beam {settings['beam']}" if settings.get("beam") else "beam exhaustive"]
    if settings.get("lm"):
        words = ", words" if settings.get("lm_words") else ""
        parts.append(f"lm {settings.get('lm_weight', 0):g} ({Path(settings['lm']).name}{words})")
    if settings.get("am_weight", 1.0) != 1.0:
        parts.append(f"am {settings['am_weight']:g}")
    if settings.get("ilm_weight"):
        parts.append(f"ilm {settings['ilm_weight']:g}")
    if settings.get("label_bonus"):
        parts.append(f"bonus {settings['label_bonus']:g}")
    if settings.get("length_norm"):
        parts.append("length norm")
    if settings.get("max_symbols") is not None:
        parts.append(f"max {settings['max_symbols']}/frame")
    return ", ".join(parts)


def _per_utterance(decode_dir: Path) -> dict[str, dict]:
    table = decode_dir / "per_utt.tsv"
    if table.is_file():
        check_score_is_current(decode_dir)
        out = {}
        with open(table, encoding="utf-8") as f:
            header = f.readline().rstrip("\n").split("\t")
            for lineno, line in enumerate(f, start=2):
                fields = dict(zip(header, line.rstrip("\n").split("\t")))
                try:
                    out[fields["id"]] = {
                        k: int(fields[k]) for k in ("ref_tokens", "sub", "del", "ins")
                    }
                except (KeyError, ValueError):
                    raise ValueError(
                        f"{table}:{lineno}: malformed line (rescore with cbasr-score)"
                    ) from None
        return out
    for name in ("ref.trn", "hyp.trn"):
        if not (decode_dir / name).is_file():
            raise FileNotFoundError(f"{decode_dir / name} not found: decode and score first")
    refs, hyps = read_trn(decode_dir / "ref.trn"), read_trn(decode_dir / "hyp.trn")
    missing = sorted(set(refs) - set(hyps))
    if missing:
        raise ValueError(
            f"{decode_dir}/hyp.trn lacks {len(missing)} utterances, e.g. {missing[:3]}"
        )
    ids = sorted(refs)
    return dict(zip(ids, utterance_counts([refs[i] for i in ids], [hyps[i] for i in ids])))


def _repeats(decode_dir: Path, counts: dict[str, dict]) -> dict[str, int] | None:
    """The repeat counts of ``score.json`` (None when it is older than them), or, for a decoding
    counted from its trn files, their sums over the utterances."""
    score_path = decode_dir / "score.json"
    if score_path.is_file():
        score = json.loads(score_path.read_text())
        return {k: score[k] for k in REPEAT_KEYS} if all(k in score for k in REPEAT_KEYS) else None
    if all(k in c for c in counts.values() for k in REPEAT_KEYS):
        return {k: sum(c[k] for c in counts.values()) for k in REPEAT_KEYS}
    return None


def _delay(decode_dir: Path) -> dict | None:
    """``score.json``'s emission delay (:mod:`cbasr.evaluation.delay`), None without one."""
    score_path = decode_dir / "score.json"
    if not score_path.is_file():
        return None
    return json.loads(score_path.read_text()).get("emission_delay")


def _parameters(exp_dir: Path, info: DecodeInfo, count: Callable[[Path], int] | None) -> int | None:
    """The decoding's recorded parameter count; for one older than that record, ``count`` of
    its checkpoint file (the caller's: this layer reads no checkpoint)."""
    if info.parameters is not None:
        return info.parameters
    ckpt = exp_dir / "checkpoints" / f"{info.checkpoint}.pt"
    return count(ckpt) if count is not None and ckpt.is_file() else None


def _train_seconds(exp_dir: Path) -> float | None:
    history = exp_dir / "history.json"
    if not history.is_file():
        return None
    epochs = json.loads(history.read_text())
    return sum(e.get("seconds", 0.0) for e in epochs) if epochs else None


def _alignment(exp_dir: Path) -> dict:
    path = exp_dir / "align" / "dev" / "alignment.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def collect_systems(
    exp_dirs: list[str | Path],
    decodes: list[str] | None = None,
    count_parameters: Callable[[Path], int] | None = None,
) -> list[System]:
    """Every decoding directory of ``exp_dirs`` (those named in ``decodes`` if given), in order;
    ``count_parameters(checkpoint file)`` fills in the parameter count of a decoding older than
    its record in ``decode.json``.

    Raises:
        FileNotFoundError: an experiment directory without ``decode/``, or a named decoding
            that one of them lacks.
    """
    systems = []
    names = [Path(e).name for e in exp_dirs]
    for exp, name in zip(map(Path, exp_dirs), names):
        label = name if names.count(name) == 1 else str(exp)
        root = exp / "decode"
        if not root.is_dir():
            raise FileNotFoundError(f"{root} not found: decode {exp} first (cbasr-decode)")
        dirs = sorted(d for d in root.iterdir() if (d / "ref.trn").is_file())
        if decodes is not None:
            missing = [d for d in decodes if not (root / d / "ref.trn").is_file()]
            if missing:
                raise FileNotFoundError(
                    f"{root}: no decoding {missing[0]!r} (has {[d.name for d in dirs]})"
                )
            dirs = [root / d for d in decodes]
        for d in dirs:
            info = DecodeInfo.read(d) or DecodeInfo()
            counts = _per_utterance(d)
            systems.append(
                System(
                    f"{label}:{d.name}",
                    exp,
                    d,
                    info,
                    {u: c["sub"] + c["del"] + c["ins"] for u, c in counts.items()},
                    counts,
                    info.epoch,
                    _parameters(exp, info, count_parameters),
                    _train_seconds(exp),
                    _alignment(exp),
                    _repeats(d, counts),
                    _delay(d),
                )
            )
    return systems


def comparison_rows(systems: list[System], samples: int = 1000, seed: int = 0) -> list[dict]:
    """One row per system: error rate, its bootstrap 95% interval, S/D/I and the rest; the
    repeat counts, then the median and 90th percentile emission delays, last (None where the
    system has none)."""
    rows = []
    for s in systems:
        ids = sorted(s.counts)
        errors = [s.errors[u] for u in ids]
        refs = [s.counts[u]["ref_tokens"] for u in ids]
        total_refs = sum(refs)
        low, high = bootstrap_interval(errors, refs, samples, seed)
        settings = s.info.settings
        rows.append(
            {
                "system": s.label,
                "error_rate": 100.0 * sum(errors) / total_refs if total_refs else 0.0,
                "ci95_low": low,
                "ci95_high": high,
                "sub": sum(s.counts[u]["sub"] for u in ids),
                "del": sum(s.counts[u]["del"] for u in ids),
                "ins": sum(s.counts[u]["ins"] for u in ids),
                "ref_tokens": total_refs,
                "utts": len(ids),
                "parameters": s.parameters,
                "epochs": s.epochs,
                "decode": describe_settings(settings),
                "rtf": s.info.rtf,
                "train_minutes": None if s.train_seconds is None else s.train_seconds / 60.0,
                "dev_onset_error_ms": s.alignment.get("mean_abs_onset_error_ms"),
                "dev_onsets_within_20ms": s.alignment.get("within_20ms"),
                **{k: None if s.repeats is None else s.repeats[k] for k in REPEAT_KEYS},
                "emission_delay_p50_ms": None if s.delay is None else s.delay["p50_ms"],
                "emission_delay_p90_ms": None if s.delay is None else s.delay["p90_ms"],
            }
        )
    return rows


def _deleted_of(deletions: int | None, tokens: int | None) -> str:
    """``deleted / tokens (percent)``, or empty when not counted."""
    if deletions is None or tokens is None:
        return ""
    return f"{deletions} / {tokens} ({100.0 * deletions / max(tokens, 1):.1f}%)"


def _delay_cell(row: dict) -> str:
    """``p50 / p90`` of a row's emission delays (ms), or empty when not measured."""
    p50, p90 = row.get("emission_delay_p50_ms"), row.get("emission_delay_p90_ms")
    return "" if p50 is None else f"{p50:.0f} / {p90:.0f}"


def markdown_table(rows: list[dict], repeats: bool = False) -> str:
    """The rows as Markdown. ``training (min)`` sums every trained epoch's time (not only up to the
    best); the onset columns are the dev forced alignment's against gold onsets (``cbasr-align``).
    ``repeats``: two more columns after ``ins``, the deletions of repeated reference tokens and
    of the others, each ``deleted / tokens (percent)``. Where a row has emission delays, a
    last column with their median / 90th percentile."""
    repeat_head, repeat_rule = (
        ("repeats deleted | others deleted | ", "---:|---:|") if repeats else ("", "")
    )
    delays = any(r.get("emission_delay_p50_ms") is not None for r in rows)
    lines = [
        f"| system | error rate (%) | 95% CI | sub | del | ins | {repeat_head}ref tokens | utts | parameters "
        "| epochs | decode | RTF | training (min) | dev onset error (ms) / within 20 ms |"
        + (" emission delay p50 / p90 (ms) |" if delays else ""),
        f"|---|---:|---|---:|---:|---:|{repeat_rule}---:|---:|---:|---:|---|---:|---:|---:|"
        + ("---:|" if delays else ""),
    ]
    for r in rows:
        repeat_cells = (
            f"{_deleted_of(r['repeat_deletions'], r['repeat_tokens'])} | "
            f"{_deleted_of(r['other_deletions'], r['other_tokens'])} | "
            if repeats
            else ""
        )
        params = f"{r['parameters'] / 1e6:.2f} M" if r["parameters"] is not None else ""
        rtf = f"{r['rtf']:.4f}" if r["rtf"] is not None else ""
        minutes = f"{r['train_minutes']:.1f}" if r["train_minutes"] is not None else ""
        onset = (
            f"{r['dev_onset_error_ms']:.1f} / {100 * r['dev_onsets_within_20ms']:.0f}%"
            if r["dev_onset_error_ms"] is not None
            else ""
        )
        lines.append(
            f"| {r['system']} | {r['error_rate']:.2f} | [{r['ci95_low']:.2f}, {r['ci95_high']:.2f}] | "
            f"{r['sub']} | {r['del']} | {r['ins']} | {repeat_cells}{r['ref_tokens']} | {r['utts']} | {params} | "
            f"{'' if r['epochs'] is None else r['epochs']} | {r['decode']} | {rtf} | {minutes} | {onset} |"
            + (f" {_delay_cell(r)} |" if delays else "")
        )
    return "\n".join(lines) + "\n"


_SEED_SUFFIX = re.compile(r"^(?P<base>.+)_s(?P<seed>[0-9]+)$")


def _base_and_seed(experiment: str) -> tuple[str, int]:
    """``"rnnt_s2"`` -> ``("rnnt", 2)``; an experiment without the suffix is seed 1."""
    match = _SEED_SUFFIX.match(experiment)
    return (match["base"], int(match["seed"])) if match else (experiment, 1)


def seed_rows(rows: list[dict]) -> list[dict]:
    """Rows of :func:`comparison_rows` pooled over seeds: the experiments ``X``, ``X_s2``,
    ``X_s3``... (seed 1 has no suffix) of one decoding become one row with each seed's error
    rate, their mean, and the deletions of repeated and of other reference tokens summed over
    the seeds. Rows without repeat counts pool to None there."""
    groups: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for r in rows:
        experiment, decode = r["system"].split(":", 1)
        base, seed = _base_and_seed(experiment)
        groups.setdefault((base, decode), []).append((seed, r))
    pooled = []
    for (base, decode), members in groups.items():
        members.sort(key=lambda m: m[0])
        rates = [r["error_rate"] for _, r in members]
        row = {
            "system": f"{base}:{decode}",
            "seeds": [seed for seed, _ in members],
            "error_rates": rates,
            "mean_error_rate": sum(rates) / len(rates),
        }
        for key in ("repeat_deletions", "repeat_tokens", "other_deletions", "other_tokens"):
            values = [r.get(key) for _, r in members]
            row[key] = None if any(v is None for v in values) else sum(values)
        pooled.append(row)
    return pooled


def seed_table(rows: list[dict]) -> str:
    """:func:`seed_rows` as Markdown, with the repeat check of the digits recipe: deleted
    repeats, pooled, at most twice the other tokens' deletion rate plus 0.5 points."""
    lines = [
        "| system | seeds | error rate (%) per seed (mean) | repeats deleted, pooled "
        "| others deleted, pooled | repeats <= 2 x others + 0.5 |",
        "|---|---|---|---:|---:|---|",
    ]
    for r in seed_rows(rows):
        rates = " / ".join(f"{e:.2f}" for e in r["error_rates"])
        check = ""
        if r["repeat_tokens"] and r["other_tokens"]:
            repeat = 100 * r["repeat_deletions"] / r["repeat_tokens"]
            bound = 2 * 100 * r["other_deletions"] / r["other_tokens"] + 0.5
            check = f"{'yes' if repeat <= bound else 'no'}: {repeat:.2f} {'<=' if repeat <= bound else '>'} {bound:.2f}"
        lines.append(
            f"| {r['system']} | {', '.join(map(str, r['seeds']))} | {rates} ({r['mean_error_rate']:.2f}) | "
            f"{_deleted_of(r['repeat_deletions'], r['repeat_tokens'])} | "
            f"{_deleted_of(r['other_deletions'], r['other_tokens'])} | {check} |"
        )
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(
        out, fieldnames=list(rows[0]) if rows else ["system"], lineterminator="\n"
    )
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def merge_csv(existing: str, rows: list[dict]) -> str:
    """``existing`` CSV text with the rows of the experiments in ``rows`` replaced by them (the
    rows of other experiments kept, in their order; new ones appended); the columns must
    agree, or the existing ones be the first of this table's (a CSV written before the later
    columns existed: its rows get them empty)."""
    old = list(csv.DictReader(io.StringIO(existing)))
    if old and rows and list(rows[0])[: len(old[0])] != list(old[0]):
        raise ValueError(
            f"the CSV's columns {list(old[0])} differ from this table's {list(rows[0])}: "
            "write a new file"
        )
    replaced = {str(r["system"]).rpartition(":")[0] for r in rows}
    columns = list(rows[0]) if rows else []
    kept = [
        {**dict.fromkeys(columns, ""), **r}
        for r in old
        if r["system"].rpartition(":")[0] not in replaced
    ]
    return csv_table(sorted(kept + list(rows), key=lambda r: str(r["system"])))


def find_systems(systems: list[System], name: str) -> list[System]:
    """Systems matching ``name``: a full label ``exp:decode`` or an experiment's label."""
    exact = [s for s in systems if s.label == name]
    if exact:
        return exact
    found = [s for s in systems if s.label.rpartition(":")[0] == name]
    if not found:
        raise ValueError(f"no system {name!r}; systems are {[s.label for s in systems]}")
    return found


def paired_comparison(a: System, b: System, samples: int = 10000, seed: int = 0) -> dict:
    """Paired bootstrap and sign test of ``a`` against ``b`` on the utterances both decoded.

    Raises:
        ValueError: when the two systems share no utterance (different splits).
    """
    ids = sorted(set(a.counts) & set(b.counts))
    if not ids:
        raise ValueError(
            f"{a.label} and {b.label} share no utterance: compare decodings of the same split"
        )
    if any(a.counts[u]["ref_tokens"] != b.counts[u]["ref_tokens"] for u in ids):
        raise ValueError(
            f"{a.label} and {b.label} have different references for the same utterances"
        )
    ea, eb = [a.errors[u] for u in ids], [b.errors[u] for u in ids]
    refs = [a.counts[u]["ref_tokens"] for u in ids]
    return {
        "a": a.label,
        "b": b.label,
        "utts": len(ids),
        "only_a": len(a.counts) - len(ids),
        "only_b": len(b.counts) - len(ids),
        "error_rate_a": 100.0 * sum(ea) / max(sum(refs), 1),
        "error_rate_b": 100.0 * sum(eb) / max(sum(refs), 1),
        "bootstrap": paired_bootstrap_test(ea, eb, refs, samples, seed),
        "sign_test": sign_test(ea, eb),
    }
