"""Error rates with substitutions, deletions and insertions, over token sequences."""

import jiwer

from cbasr.fileio import write_text

__all__ = ["error_counts", "read_trn", "write_trn"]


def error_counts(refs: list[list[str]], hyps: list[list[str]]) -> dict:
    """Levenshtein alignment counts summed over utterances.

    Returns:
        ``{"sub", "del", "ins", "hits", "errors", "ref_tokens", "utts", "error_rate"}`` where
        ``error_rate = errors / ref_tokens`` (in percent).
    """
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    counts = {"sub": 0, "del": 0, "ins": 0, "hits": 0}
    if refs:
        # jiwer aligns whitespace-separated tokens; our tokens never contain whitespace.
        out = jiwer.process_words([" ".join(r) for r in refs], [" ".join(h) for h in hyps])
        counts = {"sub": out.substitutions, "del": out.deletions, "ins": out.insertions, "hits": out.hits}
    ref_tokens = sum(len(r) for r in refs)
    errors = counts["sub"] + counts["del"] + counts["ins"]
    return {**counts, "errors": errors, "ref_tokens": ref_tokens, "utts": len(refs),
            "error_rate": 100.0 * errors / ref_tokens if ref_tokens else 0.0}


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
            entries[utt_id] = text.split()
    return entries
