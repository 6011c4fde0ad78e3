"""Brute-force oracles for the Poisson-Binomial and Conditional Bernoulli (CB paper section 2.1).

Slow and obviously correct, for tiny sizes only (T <= 8). Each function takes float64
``logits (T,)`` of one sequence, the number of existing frames ``length`` (frames
``t >= length`` are padding and never high) and, for the CB, the number of highs ``total``.
Everything is a sum over an explicit list of binary sequences, subsets or ordered drafts,
straight from the definitions (eqs. 4-8) and the meaning of each step (a conditional
probability is a ratio of two such sums), never from the recursions under test.
Results are differentiable torch scalars or tensors; an empty sum gives ``-inf``.
"""

import itertools
import math

import torch
import torch.nn.functional as F

__all__ = [
    "sequences",
    "cb_support",
    "cb_log_probs",
    "cb_mean",
    "cb_entropy",
    "log_count",
    "log_count_suffix",
    "pb_log_probs",
    "pb_mean_variance",
    "id_checking_steps",
    "bounded_steps",
    "bounded_marginals",
    "draft_steps",
    "draft_log_probs_all",
]

_NEG_INF = float("-inf")


def _log_sum(terms: list[torch.Tensor]) -> torch.Tensor:
    if not terms:
        return torch.tensor(_NEG_INF, dtype=torch.float64)
    return torch.logsumexp(torch.stack(terms), dim=0)


def sequences(T: int) -> list[tuple[int, ...]]:
    """Every binary sequence of length ``T``: 2**T of them."""
    return list(itertools.product((0, 1), repeat=T))


def _bernoulli_log_prob(logits: torch.Tensor, b: tuple[int, ...], length: int) -> torch.Tensor:
    """``log prod_t p_t^b_t (1 - p_t)^(1 - b_t)`` over existing frames (eq. 6)."""
    total = torch.zeros((), dtype=torch.float64)
    for t in range(length):
        total = total + (F.logsigmoid(logits[t]) if b[t] else F.logsigmoid(-logits[t]))
    return total


def cb_support(T: int, total: int, length: int) -> list[tuple[int, ...]]:
    """Binary sequences with exactly ``total`` highs, all before ``length``."""
    return [b for b in sequences(T) if sum(b) == total and not any(b[length:])]


def cb_log_probs(logits, total, length) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """The support and ``log P(b | k) = sum_t b_t log w_t - log sum_b' prod w^b'`` (eq. 4)."""
    support = cb_support(logits.shape[0], total, length)
    zero = torch.zeros((), dtype=torch.float64)
    scores = [sum((logits[t] for t in range(length) if b[t]), zero) for b in support]
    if not scores:
        return support, torch.zeros(0, dtype=torch.float64)
    scores = torch.stack(scores)
    return support, scores - torch.logsumexp(scores, 0)


def cb_mean(logits, total, length) -> torch.Tensor:
    """``P(B_t = 1 | k)`` for every frame: ``(T,)``."""
    support, log_probs = cb_log_probs(logits, total, length)
    mean = torch.zeros(logits.shape[0], dtype=torch.float64)
    for b, lp in zip(support, log_probs):
        mean = mean + torch.exp(lp) * torch.tensor(b, dtype=torch.float64)
    return mean


def cb_entropy(logits, total, length) -> torch.Tensor:
    """``-sum_b P(b | k) log P(b | k)``."""
    _, log_probs = cb_log_probs(logits, total, length)
    return -(torch.exp(log_probs) * log_probs).sum()


def log_count(logits, length) -> torch.Tensor:
    """``log C(v, I; w)`` of eq. (8) for ``v = 0..T``: a sum over every subset of size v."""
    T = logits.shape[0]
    out = []
    for v in range(T + 1):
        out.append(
            _log_sum([logits[list(A)].sum() for A in itertools.combinations(range(length), v)])
        )
    return torch.stack(out)


def log_count_suffix(logits, length) -> torch.Tensor:
    """``log C(v, {t..T-1} inside the existing frames; w)``: ``(T + 1, T + 1)`` [t, v]."""
    T = logits.shape[0]
    rows = []
    for t in range(T + 1):
        frames = range(t, max(t, length))
        row = []
        for v in range(T + 1):
            row.append(_log_sum([logits[list(A)].sum() for A in itertools.combinations(frames, v)]))
        rows.append(torch.stack(row))
    return torch.stack(rows)


def pb_log_probs(logits, length) -> torch.Tensor:
    """``log P(K = v)`` of eq. (5) for ``v = 0..T``, by enumerating independent Bernoullis."""
    T = logits.shape[0]
    by_count: list[list[torch.Tensor]] = [[] for _ in range(T + 1)]
    for b in sequences(T):
        if not any(b[length:]):
            by_count[sum(b)].append(_bernoulli_log_prob(logits, b, length))
    return torch.stack([_log_sum(terms) for terms in by_count])


def pb_mean_variance(logits, length) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``K`` from the enumerated ``P(K = v)``."""
    probs = torch.exp(pb_log_probs(logits, length))
    v = torch.arange(logits.shape[0] + 1, dtype=torch.float64)
    mean = (probs * v).sum()
    return mean, (probs * (v - mean) ** 2).sum()


def _log_mass(cb, keep) -> torch.Tensor:
    """``log P(keep(b) | k)``: the CB mass of the sequences satisfying ``keep``.

    ``cb`` is the ``(support, log_probs)`` pair of :func:`cb_log_probs`.
    """
    support, log_probs = cb
    return _log_sum([lp for b, lp in zip(support, log_probs) if keep(b)])


def id_checking_steps(logits, total, length, b) -> torch.Tensor:
    """``log P(b_t | b_<t, k)`` = log P(prefix b_<=t) - log P(prefix b_<t); 0 on padding."""
    T = logits.shape[0]
    cb = cb_log_probs(logits, total, length)
    steps = []
    for t in range(T):
        if t >= length:
            steps.append(torch.tensor(0.0 if b[t] == 0 else _NEG_INF, dtype=torch.float64))
            continue
        upto = _log_mass(cb, lambda s, t=t: s[: t + 1] == tuple(b[: t + 1]))
        before = _log_mass(cb, lambda s, t=t: s[:t] == tuple(b[:t]))
        steps.append(upto - before)
    return torch.stack(steps)


def _highs(b) -> tuple[int, ...]:
    return tuple(t for t, bit in enumerate(b) if bit)


def bounded_steps(logits, total, length, times) -> torch.Tensor:
    """``log P(t_l | t_<l, k)`` for increasing ``times`` of one sample: the first ``l + 1``
    highs of b are ``times[:l + 1]`` (eq. 14), divided by the first ``l`` being ``times[:l]``."""
    cb = cb_log_probs(logits, total, length)
    steps = []
    for l in range(total):
        upto = _log_mass(cb, lambda s, l=l: _highs(s)[: l + 1] == tuple(times[: l + 1]))
        before = _log_mass(cb, lambda s, l=l: _highs(s)[:l] == tuple(times[:l]))
        steps.append(upto - before)
    return torch.stack(steps) if steps else torch.zeros(0, dtype=torch.float64)


def bounded_marginals(logits, total, length) -> torch.Tensor:
    """``P(t is the l-th high | k)`` (eq. 15): ``(total, T)``."""
    T = logits.shape[0]
    support, log_probs = cb_log_probs(logits, total, length)
    out = torch.zeros(total, T, dtype=torch.float64)
    for b, lp in zip(support, log_probs):
        for l, t in enumerate(_highs(b)):
            out = out.index_put((torch.tensor(l), torch.tensor(t)), torch.exp(lp), accumulate=True)
    return out


def draft_log_probs_all(logits, total, length) -> dict[tuple[int, ...], torch.Tensor]:
    """Every ordered draft of ``total`` distinct existing frames with its Draft Bernoulli log
    probability ``log P(A | k) - log k!`` (eq. 10: each of the k! orders equally likely)."""
    support, log_probs = cb_log_probs(logits, total, length)
    out = {}
    for b, lp in zip(support, log_probs):
        for order in itertools.permutations(_highs(b)):
            out[order] = lp - math.lgamma(total + 1)
    return out


def draft_steps(logits, total, length, drafts) -> torch.Tensor:
    """``log P(t_j | t_<j, k)``: the mass of ordered drafts starting with ``drafts[:j + 1]``
    divided by the mass of those starting with ``drafts[:j]``."""
    every = draft_log_probs_all(logits, total, length)
    steps = []
    for j in range(total):
        upto = _log_sum([lp for d, lp in every.items() if d[: j + 1] == tuple(drafts[: j + 1])])
        before = _log_sum([lp for d, lp in every.items() if d[:j] == tuple(drafts[:j])])
        steps.append(upto - before)
    return torch.stack(steps) if steps else torch.zeros(0, dtype=torch.float64)
