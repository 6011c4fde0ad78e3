"""Brute-force oracles: enumerate every path of every lattice, one utterance at a time.

Slow and obviously correct, for tiny sizes only (T <= 7, L <= 4). Each function takes float64
tensors for a single utterance (no batch, no padding) and returns a differentiable scalar, so
``torch.autograd.grad`` through it gives reference gradients. Paths are summed with
``torch.logsumexp`` over an explicit list; an empty list gives ``-inf``.
"""

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "cb_emission_sets",
    "cb_path_log_prob",
    "cb_log_marginal",
    "cb_log_marginal_via_poisson_binomial",
    "cb_best_path",
    "cb_posteriors",
    "cb_windowed_log_marginal",
    "no_merge_ctc_log_marginal",
    "ctc_log_marginal",
    "transducer_paths",
    "monotonic_transducer_paths",
    "transducer_log_marginal",
    "hat_log_marginal",
    "rnnt_log_marginal",
]


def _log_sum(terms: list[torch.Tensor]) -> torch.Tensor:
    if not terms:
        return torch.tensor(float("-inf"), dtype=torch.float64)
    return torch.logsumexp(torch.stack(terms), dim=0)


# ---- Conditional Bernoulli (CB paper eqs. 18, 38) -------------------------------------------


def cb_emission_sets(T: int, L: int) -> list[tuple[int, ...]]:
    """Every set of ``L`` emission frames out of ``T`` (0-based, increasing): C(T, L) of them."""
    return list(itertools.combinations(range(T), L))


def cb_path_log_prob(
    emit_logits: torch.Tensor, label_log_probs: torch.Tensor, times: Sequence[int]
) -> torch.Tensor:
    """``log P(b, y) = sum_t log P(b_t) + sum_l log P(y_l | t_l, y_<l)`` for one emission set.

    Args:
        emit_logits: ``(T,)``; ``P(B_t = 1) = sigmoid(emit_logits[t])``.
        label_log_probs: ``(T, L)``; ``[t, l] = log P(y_l | t_l = t, y_<l)``.
        times: the ``L`` emission frames.
    """
    T = emit_logits.shape[0]
    total = torch.zeros((), dtype=torch.float64)
    for t in range(T):
        if t in times:
            total = total + F.logsigmoid(emit_logits[t])
        else:
            total = total + F.logsigmoid(-emit_logits[t])
    for l, t in enumerate(times):
        total = total + label_log_probs[t, l]
    return total


def cb_log_marginal(emit_logits: torch.Tensor, label_log_probs: torch.Tensor) -> torch.Tensor:
    """``log P(y)``, eq. (38): sum over every size-``L`` emission set."""
    T, L = label_log_probs.shape
    return _log_sum(
        [cb_path_log_prob(emit_logits, label_log_probs, s) for s in cb_emission_sets(T, L)]
    )


def cb_log_marginal_via_poisson_binomial(
    emit_logits: torch.Tensor, label_log_probs: torch.Tensor
) -> torch.Tensor:
    """``log P(L) + log E_{b|L}[P(y | b)]``, eq. (18), every term by enumeration.

    ``P(L)`` (Poisson-Binomial) sums ``P(b)`` over all ``2^T`` patterns with ``L`` ones;
    ``P(b | L) = P(b) / P(L)`` is the Conditional Bernoulli.
    """
    T, L = label_log_probs.shape
    log_pb = {}  # emission set -> log P(b)
    for bits in itertools.product((0, 1), repeat=T):
        if sum(bits) == L:
            log_pb[tuple(t for t in range(T) if bits[t])] = sum(
                F.logsigmoid(emit_logits[t] if bits[t] else -emit_logits[t]) for t in range(T)
            )
    if not log_pb:
        return torch.tensor(float("-inf"), dtype=torch.float64)
    log_p_len = _log_sum(list(log_pb.values()))
    expectation = _log_sum(
        [
            log_pb[s] - log_p_len + sum(label_log_probs[t, l] for l, t in enumerate(s))
            for s in log_pb
        ]
    )
    return log_p_len + expectation


def cb_best_path(
    emit_logits: torch.Tensor, label_log_probs: torch.Tensor
) -> tuple[tuple[int, ...], float]:
    """``argmax_b P(b, y)`` and its log probability (``((), -inf)`` if none)."""
    T, L = label_log_probs.shape
    best, best_lp = (), float("-inf")
    for s in cb_emission_sets(T, L):
        with torch.no_grad():
            lp = cb_path_log_prob(emit_logits, label_log_probs, s).item()
        if lp > best_lp:
            best, best_lp = s, lp
    return best, best_lp


def cb_posteriors(emit_logits: torch.Tensor, label_log_probs: torch.Tensor) -> torch.Tensor:
    """``(T, L)``: ``P(t_l = t | y)``, summing path probabilities per (t, l)."""
    T, L = label_log_probs.shape
    sets = cb_emission_sets(T, L)
    log_paths = [cb_path_log_prob(emit_logits, label_log_probs, s) for s in sets]
    log_z = _log_sum(log_paths)
    post = torch.zeros(T, L, dtype=torch.float64)
    for s, lp in zip(sets, log_paths):
        for l, t in enumerate(s):
            post[t, l] += torch.exp(lp - log_z).item()
    return post


def cb_windowed_log_marginal(
    emit_logits: torch.Tensor, label_log_probs: torch.Tensor
) -> torch.Tensor:
    """Second-order CB: ``label_log_probs (T, W, L)``, ``[t, d, l] = log P(y_l | t_l = t,
    t_l - t_{l-1} = d + 1, y_<l)`` with ``t_{-1} = -1``; a gap larger than ``W`` reads the
    entry of gap ``W`` (its window is the last ``W`` frames).
    """
    T, W, L = label_log_probs.shape
    terms = []
    for s in cb_emission_sets(T, L):
        gaps = [min(t - prev, W) for t, prev in zip(s, (-1,) + s[:-1])]
        total = sum(
            (F.logsigmoid(emit_logits[t] if t in s else -emit_logits[t]) for t in range(T)),
            torch.zeros((), dtype=torch.float64),
        )
        for l, (t, g) in enumerate(zip(s, gaps)):
            total = total + label_log_probs[t, g - 1, l]
        terms.append(total)
    return _log_sum(terms)


# ---- CTC and the CB/CTC relation (CB paper eqs. 39-40) --------------------------------------


def no_merge_ctc_log_marginal(
    blank_log_probs: torch.Tensor, label_log_probs: torch.Tensor, targets: Sequence[int]
) -> torch.Tensor:
    """Eq. (40): sum over augmented strings ``y' in ({-} u V)^T`` whose blank-removal is ``y``,
    repeats *not* merged. ``P(y'_t = -) = exp(blank_log_probs[t])``, ``P(y'_t = v) =
    exp(label_log_probs[t, v])`` (eq. 39).

    Args:
        blank_log_probs: ``(T,)``.
        label_log_probs: ``(T, V)``.
        targets: the ``L`` label ids.
    """
    T, V = label_log_probs.shape
    terms = []
    for string in itertools.product(range(-1, V), repeat=T):  # -1 is the blank "-"
        if [v for v in string if v != -1] != list(targets):
            continue
        terms.append(
            sum(
                (blank_log_probs[t] if v == -1 else label_log_probs[t, v])
                for t, v in enumerate(string)
            )
        )
    return _log_sum(terms)


def ctc_log_marginal(
    log_probs: torch.Tensor, targets: Sequence[int], blank: int = 0
) -> torch.Tensor:
    """Standard CTC: every alignment in ``V^T`` whose collapse (merge repeats, then drop
    blanks) is ``targets``.

    Args:
        log_probs: ``(T, V)`` over the blank-augmented vocabulary.
    """
    T, V = log_probs.shape
    terms = []
    for align in itertools.product(range(V), repeat=T):
        merged = [v for i, v in enumerate(align) if i == 0 or v != align[i - 1]]
        if [v for v in merged if v != blank] == list(targets):
            terms.append(sum(log_probs[t, v] for t, v in enumerate(align)))
    return _log_sum(terms)


# ---- Transducer lattices (RNN-T; HAT paper eq. 4) -------------------------------------------


def transducer_paths(T: int, U: int) -> list[tuple[str, ...]]:
    """Every RNN-T lattice path: ``T`` blanks ``"b"`` and ``U`` labels ``"y"``, the last move
    a blank (torchaudio's convention), so ``C(T + U - 1, U)`` paths (none if ``T = 0``)."""
    if T == 0:
        return []
    paths = []
    for emit_positions in itertools.combinations(range(T + U - 1), U):
        moves = ["b"] * (T + U)
        for k in emit_positions:
            moves[k] = "y"
        paths.append(tuple(moves))
    return paths


def _sum_transducer_paths(T: int, U: int, blank_edge, label_edge) -> torch.Tensor:
    """Walk every path from (0, 0); ``blank_edge(t, u)`` / ``label_edge(t, u)`` give the log
    weight of the blank / label edge leaving node ``(t, u)``."""
    terms = []
    for moves in transducer_paths(T, U):
        t = u = 0
        total = torch.zeros((), dtype=torch.float64)
        for m in moves:
            if m == "b":
                total, t = total + blank_edge(t, u), t + 1
            else:
                total, u = total + label_edge(t, u), u + 1
        terms.append(total)
    return _log_sum(terms)


def monotonic_transducer_paths(T: int, U: int) -> list[tuple[str, ...]]:
    """Every one-label-per-frame lattice path: ``T`` moves, one per frame, ``U`` of them labels
    ``"y"`` (which also advance the frame), the others blanks ``"b"``: ``C(T, U)`` paths."""
    paths = []
    for emit_frames in itertools.combinations(range(T), U):
        moves = ["b"] * T
        for k in emit_frames:
            moves[k] = "y"
        paths.append(tuple(moves))
    return paths


def _sum_monotonic_paths(T: int, U: int, blank_edge, label_edge) -> torch.Tensor:
    """:func:`_sum_transducer_paths` for the one-label-per-frame lattice: frame ``t`` takes
    either the blank or a label edge leaving ``(t, u)``."""
    terms = []
    for moves in monotonic_transducer_paths(T, U):
        u = 0
        total = torch.zeros((), dtype=torch.float64)
        for t, m in enumerate(moves):
            if m == "b":
                total = total + blank_edge(t, u)
            else:
                total, u = total + label_edge(t, u), u + 1
        terms.append(total)
    return _log_sum(terms)


def transducer_log_marginal(
    blank_log_probs: torch.Tensor, emit_log_probs: torch.Tensor, monotonic: bool = False
) -> torch.Tensor:
    """Sum over every lattice path of the product of its edge probabilities.

    Args:
        blank_log_probs: ``(T, U + 1)``; the blank edge leaving node ``(t, u)``.
        emit_log_probs: ``(T, U)``; the edge emitting ``y_{u+1}`` at node ``(t, u)``.
        monotonic: the one-label-per-frame lattice instead of the RNN-T one.
    """
    T, U1 = blank_log_probs.shape
    walk = _sum_monotonic_paths if monotonic else _sum_transducer_paths
    return walk(T, U1 - 1, lambda t, u: blank_log_probs[t, u], lambda t, u: emit_log_probs[t, u])


def hat_log_marginal(
    blank_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    targets: Sequence[int],
    monotonic: bool = False,
) -> torch.Tensor:
    """HAT eq. (4): blank ``b_{t,u} = sigmoid(blank_logits[t, u])``, label
    ``(1 - b_{t,u}) P_{t,u}(y_{u+1})``.

    Args:
        blank_logits: ``(T, U + 1)``.
        label_log_probs: ``(T, U + 1, V)``, normalised over ``V``.
        targets: the ``U`` label ids.
    """
    T, U1 = blank_logits.shape
    walk = _sum_monotonic_paths if monotonic else _sum_transducer_paths
    return walk(
        T,
        U1 - 1,
        lambda t, u: torch.log(torch.sigmoid(blank_logits[t, u])),
        lambda t, u: (
            torch.log(1 - torch.sigmoid(blank_logits[t, u])) + label_log_probs[t, u, targets[u]]
        ),
    )


def rnnt_log_marginal(
    logits: torch.Tensor, targets: Sequence[int], blank: int = 0, monotonic: bool = False
) -> torch.Tensor:
    """RNN-T with a softmax over ``V`` classes including blank.

    Args:
        logits: ``(T, U + 1, V)``.
        monotonic: the one-label-per-frame lattice instead of the RNN-T one.
    """
    log_probs = logits.log_softmax(dim=-1)
    T, U1, _ = logits.shape
    walk = _sum_monotonic_paths if monotonic else _sum_transducer_paths
    return walk(
        T,
        U1 - 1,
        lambda t, u: log_probs[t, u, blank],
        lambda t, u: log_probs[t, u, targets[u]],
    )
