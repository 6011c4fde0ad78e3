"""Error rates with substitutions, deletions and insertions, per utterance, speaker and split,
with bootstrap confidence intervals and a paired significance test.

Alignments are jiwer's (Levenshtein over whitespace-free tokens), so totals, per-utterance
counts and the error-alignment file agree. Statistics resample utterances (the unit of
independence), not tokens:

- :func:`bootstrap_interval`: a percentile bootstrap of the error rate ``sum errors / sum
  reference tokens`` over utterances (Bisani and Ney, 2004, "Bootstrap estimates for
  confidence intervals in ASR performance evaluation");
- :func:`paired_bootstrap_test`: the same resampling applied to two systems' errors on the
  same utterances, giving the distribution of their difference and a two-sided p-value;
- :func:`sign_test`: an exact two-sided sign test on the utterances where the systems' error
  counts differ, as a check that needs no resampling.

Beside S/D/I, :func:`repeat_deletion_counts` splits the deletions between reference tokens that
repeat their predecessor (the second "two" of "two two": a model that needs a boundary between
equal labels, as CTC needs a blank, or that emits at most one label per frame, may merge them)
and the other reference tokens.
"""

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import jiwer
import numpy as np

from cbasr.data.vocab import SENTENCEPIECE, tokens_to_words
from cbasr.evaluation.decode_info import DecodeInfo
from cbasr.evaluation.delay import TIMING_FILE, delay_summary, emission_delays, read_timing
from cbasr.evaluation.rouge import rouge_f1
from cbasr.storage.files import write_json, write_text

__all__ = [
    "file_digest",
    "check_score_is_current",
    "error_counts",
    "utterance_counts",
    "repeat_deletion_counts",
    "REPEAT_KEYS",
    "align_tokens",
    "format_alignment",
    "read_trn",
    "write_trn",
    "read_utt2spk",
    "bootstrap_interval",
    "paired_bootstrap_test",
    "sign_test",
    "score_decode_dir",
    "decode_dir_name",
]


def decode_dir_name(split: str, tag: str | None) -> str:
    """``<split>`` or ``<split>_<tag>``: where cbasr-decode writes a split's decoding (here,
    beside the scoring that reads it, so that scoring needs no torch)."""
    return f"{split}_{tag}" if tag else split


REPEAT_KEYS = ("repeat_deletions", "repeat_tokens", "other_deletions", "other_tokens")
_COUNT_KEYS = ("sub", "del", "ins", "hits", *REPEAT_KEYS)


def repeat_deletion_counts(ref: list[str], deleted: list[bool]) -> dict:
    """Deletions of repeated reference tokens and of the others, in one utterance.

    A reference token is a *repeat* when it equals its predecessor (``ref[i] == ref[i - 1]``), so
    a run of ``k`` equal tokens holds ``k - 1`` repeats and one other token, its first. Which
    tokens of a run an edit-distance alignment deletes is a tie ("two two" against "two" may
    delete either "two" at the same cost), so deletions are counted per run, from how many
    tokens of it are deleted, not which: when ``d`` of a run's ``k`` tokens are deleted,
    ``min(d, k - 1)`` are repeat deletions and the rest (one when the whole run is deleted,
    else none) an other deletion. "two two" against "two" is thus one repeat deletion
    whichever "two" the alignment drops; a run of 3 that keeps one token loses 2 repeats, and
    one that is deleted whole loses 2 repeats and 1 other token. A substituted token is not
    deleted. The numbers add up: ``repeat_deletions + other_deletions`` is the deletion count
    and ``repeat_tokens + other_tokens`` the reference length.

    How many tokens each run loses is the scored alignment's (the one behind S/D/I and
    ``errors.pra``); where two alignments of equal cost move a deletion from one run to another
    ("a a b" against "c c": delete "b", or one "a" and substitute "b"), the counts follow it,
    as S/D/I do.

    Args:
        ref: the reference tokens, ``(N,)``.
        deleted: per reference token, whether the alignment deletes it, ``(N,)``.

    Returns:
        ``{"repeat_deletions", "repeat_tokens", "other_deletions", "other_tokens"}``.
    """
    if len(ref) != len(deleted):
        raise ValueError(f"{len(ref)} reference tokens but {len(deleted)} deletion flags")
    counts = dict.fromkeys(REPEAT_KEYS, 0)
    start = 0
    for end in range(1, len(ref) + 1):
        if end < len(ref) and ref[end] == ref[start]:
            continue
        k, d = end - start, sum(deleted[start:end])  # the run ref[start:end]
        counts["repeat_tokens"] += k - 1
        counts["other_tokens"] += 1
        counts["repeat_deletions"] += min(d, k - 1)
        counts["other_deletions"] += d - min(d, k - 1)
        start = end
    return counts


def _summary(counts: dict, ref_tokens: int, utts: int) -> dict:
    errors = counts["sub"] + counts["del"] + counts["ins"]
    return {
        **counts,
        "errors": errors,
        "ref_tokens": ref_tokens,
        "utts": utts,
        "error_rate": 100.0 * errors / ref_tokens if ref_tokens else 0.0,
    }


def error_counts(refs: list[list[str]], hyps: list[list[str]]) -> dict:
    """Levenshtein alignment counts summed over utterances.

    Returns:
        ``{"sub", "del", "ins", "hits", "repeat_deletions", "repeat_tokens", "other_deletions",
        "other_tokens", "errors", "ref_tokens", "utts", "error_rate"}`` where ``error_rate =
        errors / ref_tokens`` (in percent); see :func:`repeat_deletion_counts` for the repeats.
    """
    per_utt = utterance_counts(refs, hyps)
    counts = {k: sum(c[k] for c in per_utt) for k in _COUNT_KEYS}
    return _summary(counts, sum(len(r) for r in refs), len(refs))


def _jiwer(refs: list[list[str]], hyps: list[list[str]]):
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    # jiwer aligns whitespace-separated tokens; our tokens never contain whitespace.
    return jiwer.process_words([" ".join(r) for r in refs], [" ".join(h) for h in hyps])


def utterance_counts(refs: list[list[str]], hyps: list[list[str]]) -> list[dict]:
    """Per utterance ``{"sub", "del", "ins", "hits", "ref_tokens"}`` and the deletions of repeated
    and other reference tokens (:func:`repeat_deletion_counts`)."""
    if not refs:
        if hyps:
            raise ValueError(f"0 references but {len(hyps)} hypotheses")
        return []
    out = []
    for ref, chunks in zip(refs, _jiwer(refs, hyps).alignments):
        counts = dict.fromkeys(("sub", "del", "ins", "hits"), 0)
        deleted = [False] * len(ref)
        for c in chunks:
            n_ref, n_hyp = c.ref_end_idx - c.ref_start_idx, c.hyp_end_idx - c.hyp_start_idx
            key = {"equal": "hits", "substitute": "sub", "delete": "del", "insert": "ins"}[c.type]
            counts[key] += n_hyp if c.type == "insert" else n_ref
            if c.type == "delete":
                deleted[c.ref_start_idx : c.ref_end_idx] = [True] * n_ref
        out.append({**counts, **repeat_deletion_counts(ref, deleted), "ref_tokens": len(ref)})
    return out


def align_tokens(ref: list[str], hyp: list[str]) -> list[tuple[str, str | None, str | None]]:
    """The alignment of one pair as ``(op, ref token, hyp token)``, ``op`` one of ``C`` (correct),
    ``S``, ``D`` (hyp token None), ``I`` (ref token None)."""
    if not ref and not hyp:
        return []
    ops = []
    for c in _jiwer([ref], [hyp]).alignments[0]:
        r, h = ref[c.ref_start_idx : c.ref_end_idx], hyp[c.hyp_start_idx : c.hyp_end_idx]
        if c.type == "equal":
            ops += [("C", a, b) for a, b in zip(r, h)]
        elif c.type == "substitute":
            ops += [("S", a, b) for a, b in zip(r, h)]
        elif c.type == "delete":
            ops += [("D", a, None) for a in r]
        else:
            ops += [("I", None, b) for b in h]
    return ops


def format_alignment(
    utt_id: str, ref: list[str], hyp: list[str], speaker: str | None = None
) -> str:
    """One sclite-style block (``.pra``): counts, then REF, HYP and Eval rows in aligned columns,
    ``***`` for the gap of a deletion or insertion and S, D or I under each error."""
    ops = align_tokens(ref, hyp)
    n = {op: sum(o == op for o, _, _ in ops) for op in "CSDI"}
    cols = [(r or "***", h or "***", "" if op == "C" else op) for op, r, h in ops]
    widths = [max(len(r), len(h), 1) for r, h, _ in cols]
    row = lambda k: "  ".join(c[k].ljust(w) for c, w in zip(cols, widths)).rstrip()  # noqa: E731
    head = f"id: ({utt_id})" + (f"  speaker: {speaker}" if speaker else "")
    return (
        f"{head}\nScores: (#C #S #D #I) {n['C']} {n['S']} {n['D']} {n['I']}\n"
        f"REF:  {row(0)}\nHYP:  {row(1)}\nEval: {row(2)}\n\n"
    )


def write_trn(path, entries: list[tuple[str, list[str]]]) -> None:
    """sclite ``trn`` lines ``tok tok ... (utt_id)``."""
    write_text(path, "".join(f"{' '.join(tokens)} ({utt_id})\n" for utt_id, tokens in entries))


def read_trn(path) -> dict[str, list[str]]:
    """``{utt_id: tokens}`` from a ``trn`` file; raises naming the file and line if malformed."""
    entries = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if not line.endswith(")") or "(" not in line:
                raise ValueError(f"{path}:{lineno}: not a trn line (expected 'tokens (utt_id)')")
            text, _, utt_id = line[:-1].rpartition("(")
            if utt_id in entries:
                raise ValueError(f"{path}:{lineno}: utterance {utt_id!r} listed twice")
            entries[utt_id] = text.split()
    return entries


def read_utt2spk(path) -> dict[str, str]:
    """``{utt_id: speaker}`` from ``utt_id speaker`` lines; raises naming the file and line."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2:
                raise ValueError(
                    f"{path}:{lineno}: expected 'utt_id speaker', got {line.strip()!r}"
                )
            out[fields[0]] = fields[1]
    return out


def _resample(n: int, samples: int, seed: int) -> np.ndarray:
    """``(samples, n)`` utterance indices drawn with replacement."""
    return np.random.default_rng(seed).integers(0, n, size=(samples, n))


def bootstrap_interval(
    errors, ref_tokens, samples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the error rate (percent) over utterances.

    Args:
        errors, ref_tokens: per utterance, ``(n,)``.
        samples: bootstrap replicates; seed: their random generator's seed (fixed: the same
            interval every time).
    """
    errors, ref_tokens = (
        np.asarray(errors, dtype=np.float64),
        np.asarray(ref_tokens, dtype=np.float64),
    )
    if errors.size == 0:
        return (0.0, 0.0)
    idx = _resample(errors.size, samples, seed)
    rates = 100.0 * errors[idx].sum(1) / np.maximum(ref_tokens[idx].sum(1), 1.0)
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(rates, [tail, 100.0 - tail])
    return float(low), float(high)


def paired_bootstrap_test(
    errors_a, errors_b, ref_tokens, samples: int = 10000, seed: int = 0
) -> dict:
    """Paired bootstrap of the error-rate difference ``A - B`` (Bisani and Ney, 2004).

    Both systems' per-utterance errors are resampled with the same utterance indices.

    Returns:
        ``{"difference", "ci95", "p_value", "p_a_better", "samples"}``: the observed difference
        (percent points), its 95% interval, the two-sided p-value ``2 min(P(d <= 0), P(d >= 0))``
        (capped at 1) and the share of replicates where A has fewer errors.
    """
    a, b = np.asarray(errors_a, dtype=np.float64), np.asarray(errors_b, dtype=np.float64)
    refs = np.asarray(ref_tokens, dtype=np.float64)
    if not a.size == b.size == refs.size:
        raise ValueError(
            f"paired test needs the same utterances: {a.size}, {b.size} and {refs.size} values"
        )
    if a.size == 0:
        raise ValueError("paired test on no utterances")
    observed = 100.0 * (a.sum() - b.sum()) / max(refs.sum(), 1.0)
    idx = _resample(a.size, samples, seed)
    diff = 100.0 * (a[idx].sum(1) - b[idx].sum(1)) / np.maximum(refs[idx].sum(1), 1.0)
    p = min(1.0, 2.0 * min(float(np.mean(diff <= 0)), float(np.mean(diff >= 0))))
    low, high = np.percentile(diff, [2.5, 97.5])
    return {
        "difference": float(observed),
        "ci95": [float(low), float(high)],
        "p_value": p,
        "p_a_better": float(np.mean(diff < 0)),
        "samples": samples,
    }


def sign_test(errors_a, errors_b) -> dict:
    """Exact two-sided sign test on utterances where A and B make different numbers of errors.

    Returns:
        ``{"a_better", "b_better", "ties", "p_value"}``.
    """
    a_better = sum(x < y for x, y in zip(errors_a, errors_b))
    b_better = sum(x > y for x, y in zip(errors_a, errors_b))
    n, k = a_better + b_better, min(a_better, b_better)
    # integers throughout: 2.0**n overflows a float past n = 1023 differing utterances
    tail = sum(math.comb(n, i) for i in range(k + 1)) / (1 << n) if n else 1.0
    return {
        "a_better": a_better,
        "b_better": b_better,
        "ties": len(errors_a) - n,
        "p_value": min(1.0, 2.0 * tail),
    }


def read_token_map(path: str | Path) -> dict[str, str | None]:
    """A scoring map, one ``token<TAB>mapped`` per line; an empty ``mapped`` deletes the token
    (TIMIT's ``map_39.txt``: 61 or 48 phones to 39, ``q`` deleted)."""
    table = {}
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        token, _, mapped = line.partition("\t")
        if not token:
            raise ValueError(f"{path}:{lineno}: expected 'token<TAB>mapped token', got {line!r}")
        table[token] = mapped.strip() or None
    return table


def map_tokens(tokens: list[str], table: dict[str, str | None]) -> list[str]:
    """``tokens`` through a scoring map; tokens it does not list stay as they are."""
    return [table.get(t, t) for t in tokens if table.get(t, t) is not None]


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex): ``score.json`` records its ``hyp.trn``'s."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_score_is_current(decode_dir: str | Path) -> None:
    """Raise ``ValueError`` if ``score.json`` was computed from another ``hyp.trn`` than the one
    in ``decode_dir`` (a later decoding into the same directory): its numbers would be stale."""
    decode_dir = Path(decode_dir)
    score_path = decode_dir / "score.json"
    if not score_path.is_file():
        return
    recorded = json.loads(score_path.read_text()).get("hyp_sha256")
    if recorded is not None and recorded != file_digest(decode_dir / "hyp.trn"):
        raise ValueError(
            f"{score_path} was computed from another hyp.trn than the one beside it: "
            f"rescore with cbasr-score --exp-dir ... (decoding {decode_dir.name})"
        )


@dataclass
class _Tally:
    """One speaker's error counts (:data:`_COUNT_KEYS`), utterances and reference tokens."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNT_KEYS, 0))
    utts: int = 0
    ref_tokens: int = 0

    def add(self, utterance: dict) -> None:
        for k in _COUNT_KEYS:
            self.counts[k] += utterance[k]
        self.utts += 1
        self.ref_tokens += utterance["ref_tokens"]


def score_decode_dir(
    decode_dir: str | Path,
    bootstrap_samples: int = 1000,
    seed: int = 0,
    token_map: str | Path | None = None,
    rouge: bool = False,
    groups: dict[str, dict[str, str]] | None = None,
) -> dict:
    """Score ``hyp.trn`` against ``ref.trn`` in ``decode_dir``; every reference needs a hypothesis.

    Writes ``score.json`` (totals, with the deletions of repeated and other reference tokens
    beside S/D/I (:func:`repeat_deletion_counts`), 95% bootstrap interval, per-speaker counts
    when ``utt2spk`` is there, the decoding's checkpoint and settings, and for character or sentencepiece units
    the word error counts under ``"words"``), ``per_utt.tsv`` (id, speaker, reference
    tokens, S, D, I) and ``errors.pra`` (the alignment of every utterance, errors marked).

    Args:
        token_map: a :func:`read_token_map` file applied to references and hypotheses first
            (TIMIT: score on 39 phones).
        rouge: also ROUGE-1/2/L F1 of the hypothesis words against the reference words
            (headline generation), under ``"rouge"``.
        groups: ``{field: {utterance: value}}`` (a manifest field, e.g. ``age_group``): the
            counts and 95% interval of each value's utterances under ``"by_<field>"``.
    """
    decode_dir = Path(decode_dir)
    for name in ("ref.trn", "hyp.trn"):
        if not (decode_dir / name).is_file():
            raise FileNotFoundError(f"{decode_dir / name} not found: decode first (cbasr-decode)")
    refs, hyps = read_trn(decode_dir / "ref.trn"), read_trn(decode_dir / "hyp.trn")
    missing = sorted(set(refs) - set(hyps))
    if missing:
        raise ValueError(
            f"{decode_dir}/hyp.trn lacks {len(missing)} utterances, e.g. {missing[:3]}"
        )
    table = None if token_map is None else read_token_map(token_map)
    timing = _timing(decode_dir, refs, hyps, table)
    if table is not None:
        refs = {u: map_tokens(t, table) for u, t in refs.items()}
        hyps = {u: map_tokens(t, table) for u, t in hyps.items()}
    ids = sorted(refs)
    speakers = read_utt2spk(decode_dir / "utt2spk") if (decode_dir / "utt2spk").is_file() else {}
    per_utt = utterance_counts([refs[i] for i in ids], [hyps[i] for i in ids])
    score = _summary(
        {k: sum(c[k] for c in per_utt) for k in _COUNT_KEYS},
        sum(len(refs[i]) for i in ids),
        len(ids),
    )
    errors = [c["sub"] + c["del"] + c["ins"] for c in per_utt]
    score["ci95"] = list(
        bootstrap_interval(errors, [c["ref_tokens"] for c in per_utt], bootstrap_samples, seed)
    )
    if speakers:
        by_speaker: dict[str, _Tally] = {}
        for utt, c in zip(ids, per_utt):
            by_speaker.setdefault(speakers.get(utt, "unknown"), _Tally()).add(c)
        score["by_speaker"] = {
            s: _summary(t.counts, t.ref_tokens, t.utts) for s, t in sorted(by_speaker.items())
        }
    for key, values in (groups or {}).items():
        by_value: dict[str, list[int]] = {}
        for n, utt in enumerate(ids):
            by_value.setdefault(str(values.get(utt, "unknown")), []).append(n)
        score[f"by_{key}"] = {}
        for value, rows in sorted(by_value.items()):
            tally = _Tally()
            for n in rows:
                tally.add(per_utt[n])
            summary = _summary(tally.counts, tally.ref_tokens, tally.utts)
            summary["ci95"] = list(
                bootstrap_interval(
                    [errors[n] for n in rows],
                    [per_utt[n]["ref_tokens"] for n in rows],
                    bootstrap_samples,
                    seed,
                )
            )
            score[f"by_{key}"][value] = summary
    score["hyp_sha256"] = file_digest(decode_dir / "hyp.trn")
    info = DecodeInfo.read(decode_dir)
    if timing:
        delays = [
            d
            for u in ids
            if u in timing
            for d in emission_delays(align_tokens(refs[u], hyps[u]), *timing[u])
        ]
        score["emission_delay"] = {
            **delay_summary(delays),
            "emission": None if info is None else info.emission,
        }
    if info is not None:
        score.update(
            skipped=info.skipped,
            failed=info.failed,
            empty_refs=info.empty_refs,
            oov_ref_utts=info.oov_ref_utts,
            checkpoint=info.checkpoint,
            epoch=info.epoch,
            settings=info.settings,
        )
        units = info.units
        if units == "chars" or units.startswith(
            SENTENCEPIECE
        ):  # the error rate is a CER: add the WER
            score["words"] = error_counts(
                [tokens_to_words(refs[i], units) for i in ids],
                [tokens_to_words(hyps[i], units) for i in ids],
            )
        if rouge:
            score["rouge"] = rouge_f1(
                [" ".join(tokens_to_words(refs[i], units)) for i in ids],
                [" ".join(tokens_to_words(hyps[i], units)) for i in ids],
            )
    elif rouge:
        raise FileNotFoundError(
            f"{decode_dir / 'decode.json'} not found: ROUGE needs the decoding's units"
        )
    if token_map is not None:
        score["token_map"] = str(token_map)
    write_json(decode_dir / "score.json", score)
    write_text(
        decode_dir / "per_utt.tsv",
        "id\tspeaker\tref_tokens\tsub\tdel\tins\n"
        + "".join(
            f"{u}\t{speakers.get(u, '')}\t{c['ref_tokens']}\t{c['sub']}\t{c['del']}\t{c['ins']}\n"
            for u, c in zip(ids, per_utt)
        ),
    )
    write_text(
        decode_dir / "errors.pra",
        "".join(format_alignment(u, refs[u], hyps[u], speakers.get(u)) for u in ids),
    )
    return score


def _timing(decode_dir: Path, refs: dict, hyps: dict, table: dict | None) -> dict:
    """``timing.tsv``'s gold ends and emission times by utterance (those with gold ends),
    through the token map with their tokens; empty without the file."""
    path = decode_dir / TIMING_FILE
    if not path.is_file():
        return {}
    out = {}
    for u, (ends, emitted) in read_timing(path).items():
        if u not in refs or ends is None:
            continue
        if len(ends) != len(refs[u]) or len(emitted) != len(hyps.get(u, [])):
            raise ValueError(
                f"{path}: utterance {u} has {len(ends)} gold ends and {len(emitted)} emission "
                f"times for {len(refs[u])} reference and {len(hyps.get(u, []))} hypothesis "
                "tokens: decode again (cbasr-decode)"
            )
        if table is not None:
            ends = [e for t, e in zip(refs[u], ends) if table.get(t, t) is not None]
            emitted = [e for t, e in zip(hyps[u], emitted) if table.get(t, t) is not None]
        out[u] = (ends, emitted)
    return out
