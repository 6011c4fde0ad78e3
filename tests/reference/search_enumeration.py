"""Oracles for the searches: every label sequence up to a length, and its exact probability.

Slow and obviously correct, for tiny sizes only. A sequence's probability comes from the
exact losses (themselves tested against path enumeration in ``lattice_enumeration``), or, for
the transducer's per-frame cap, from enumerating the lattice paths of that sequence and keeping
those with at most ``cap`` labels on each frame.
"""

import itertools

import torch

from tests.reference.lattice_enumeration import transducer_paths

__all__ = ["label_sequences", "padded", "capped_transducer_log_prob", "argmax_unique"]


def label_sequences(num_labels: int, max_len: int) -> list[tuple[int, ...]]:
    """Every sequence over the ids ``1 .. num_labels`` of length ``0 .. max_len``."""
    out = [()]
    for n in range(1, max_len + 1):
        out += list(itertools.product(range(1, num_labels + 1), repeat=n))
    return out


def padded(seqs: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(targets (B, L), lengths (B,))``, padding with id 1."""
    L = max([1] + [len(s) for s in seqs])
    targets = torch.ones(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            targets[i, : len(s)] = torch.tensor(s)
    return targets, torch.tensor([len(s) for s in seqs])


def capped_transducer_log_prob(blank: torch.Tensor, label: torch.Tensor, cap: int) -> float:
    """``log`` of the sum over the lattice paths with at most ``cap`` labels on every frame.

    Args:
        blank: ``(T, U + 1)`` log weight of the blank edge leaving node ``(t, u)``.
        label: ``(T, U)`` log weight of the label edge leaving node ``(t, u)``.
    """
    T, U = label.shape
    terms = []
    for moves in transducer_paths(T, U):
        t = u = run = 0
        total, ok = 0.0, True
        for m in moves:
            if m == "b":
                total, t, run = total + float(blank[t, u]), t + 1, 0
            else:
                total, u, run = total + float(label[t, u]), u + 1, run + 1
                ok = ok and run <= cap
        if ok:
            terms.append(total)
    if not terms:
        return float("-inf")
    return float(torch.logsumexp(torch.tensor(terms, dtype=torch.float64), 0))


def argmax_unique(scores: dict, margin: float = 1e-6):
    """The key of the largest value, checking that the runner-up is ``margin`` below it (so a
    search that returns it is not winning a tie by luck)."""
    ranked = sorted(scores, key=scores.get, reverse=True)
    assert scores[ranked[0]] - scores[ranked[1]] > margin, "tie at the top: pick another seed"
    return ranked[0]


def reference_transducer_search(step, T: int, beam: int, cap: int) -> dict[tuple, float]:
    """The time-synchronous transducer beam search of :mod:`cbasr.search.transducer`, written
    plainly for one utterance: dicts of prefixes, no batching, no state reuse.

    Args:
        step: ``step(prefix, t) -> (log P(blank), [log P(label v) for v = 1 .. V-1])`` at
            frame ``t`` after ``prefix``.

    Returns:
        ``{prefix: log probability mass}`` of the final beam.
    """

    def log_add(a, b):
        return float(
            torch.logaddexp(
                torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
            )
        )

    beam_now = {(): 0.0}
    for t in range(T):
        finished, current = {}, dict(beam_now)
        for s in range(cap + 1):
            scores = {y: step(y, t) for y in current}
            for y, mass in current.items():  # take the blank: merge with the same prefix
                finished[y] = log_add(finished.get(y, float("-inf")), mass + scores[y][0])
            if s == cap:
                break
            pool = [(mass, "finished", y) for y, mass in finished.items()]
            pool += [
                (mass + lp, "current", y + (v,))
                for y, mass in current.items()
                for v, lp in enumerate(scores[y][1], start=1)
            ]
            kept = sorted(pool, key=lambda e: e[0], reverse=True)[:beam]
            finished = {y: m for m, kind, y in kept if kind == "finished"}
            current = {y: m for m, kind, y in kept if kind == "current"}
            if not current:
                break
        beam_now = dict(sorted(finished.items(), key=lambda e: e[1], reverse=True)[:beam])
    return beam_now
