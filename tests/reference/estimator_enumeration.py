"""Brute-force oracles for the sampling estimators (CB paper sections 1, 2.2 and 3).

Slow and obviously correct, for tiny sizes only (T <= 8). Each function takes one sequence:
float64 ``logits (T,)``, the number of existing frames ``length`` and of labels ``total``.
Expectations are sums over an explicit list of every binary sequence, each weighted by its
probability computed straight from the definitions (independent Bernoullis, eq. 6; the CB,
eq. 4; a proposal as the product of its steps, eqs. 48, 50, 51, with the counts of eq. 50 and
the binomial of eq. 51 summed term by term), never from the recursions under test. Results
are differentiable torch scalars.
"""

import itertools
import math

import torch
import torch.nn.functional as F

from tests.reference.cb_enumeration import cb_log_probs, sequences

__all__ = [
    "times_of",
    "log_prior",
    "expected_reward",
    "expected_function",
    "proposal_log_probs",
    "evidence_lower_bound",
    "multi_sample_bound",
    "forced_suffix_marginals_by_recursion",
]


def times_of(b) -> tuple[int, ...]:
    """The frames of the highs of ``b``, in order."""
    return tuple(t for t, bit in enumerate(b) if bit)


def _bernoulli_log_prob(logits, b, length) -> torch.Tensor:
    """``sum_t log P(b_t)`` over existing frames (eq. 6)."""
    out = torch.zeros((), dtype=torch.float64)
    for t in range(length):
        out = out + (F.logsigmoid(logits[t]) if b[t] else F.logsigmoid(-logits[t]))
    return out


def log_prior(logits, total, length) -> torch.Tensor:
    """``log P(L = total)``: the probability mass of every sequence with ``total`` highs."""
    terms = [
        _bernoulli_log_prob(logits, b, length)
        for b in sequences(logits.shape[0])
        if sum(b) == total and not any(b[length:])
    ]
    return torch.logsumexp(torch.stack(terms), 0)


def expected_function(logits, total, length, f) -> torch.Tensor:
    """``log P(L) + sum_b P(b | L) f(times of b)`` for a function of the emission times."""
    support, log_probs = cb_log_probs(logits, total, length)
    value = sum(torch.exp(lp) * f(times_of(b)) for b, lp in zip(support, log_probs))
    return log_prior(logits, total, length) + value


def expected_reward(logits, total, length, rewards) -> torch.Tensor:
    """Eq. (19) for memoryless ``rewards (T, L)``: ``f(t) = sum_l rewards[t_l, l]``."""
    zero = torch.zeros((), dtype=torch.float64)
    return expected_function(
        logits, total, length, lambda times: sum((rewards[t, l] for l, t in enumerate(times)), zero)
    )


def _count(weights, frames, v) -> torch.Tensor:
    """``C(v, frames; w)`` of eq. (8): a sum over every subset of ``v`` frames."""
    if v < 0:
        return torch.zeros((), dtype=torch.float64)
    terms = [
        torch.prod(weights[list(A)]) if A else torch.ones((), dtype=torch.float64)
        for A in itertools.combinations(frames, v)
    ]
    return sum(terms, torch.zeros((), dtype=torch.float64))


def _high_probability(proposal, logits, t, remaining, length, total, independent):
    """``Q(B_t = 1 | b_<t, L)`` of eq. (48), (50) or (51) for an unforced step."""
    if proposal == "forced_suffix":
        return torch.sigmoid(logits[t])  # eq. (48)
    w = torch.exp(logits[t])
    after = range(t + 1, length)
    if proposal == "id_checking":  # eq. (50), first line: w_t C(r - 1) / (C(r) + w_t C(r - 1))
        w_prime = torch.exp(independent)
        on, off = w * _count(w_prime, after, remaining - 1), _count(w_prime, after, remaining)
        return on / (on + off)
    # eq. (51), first line: the suffix count of a Binomial(n, p = L / T).
    p, n = total / length, len(after)

    def binomial(k):
        return math.comb(n, k) * p**k * (1 - p) ** (n - k) if 0 <= k <= n else 0.0

    on, off = w * binomial(remaining - 1), binomial(remaining)
    return on / (on + off)


def proposal_log_probs(proposal, logits, total, length, independent=None) -> dict:
    """``{b: log Q(b | L)}`` over every sequence with ``Q(b) > 0``, as products of steps."""
    out = {}
    for b in sequences(logits.shape[0]):
        if sum(b) != total or any(b[length:]):
            continue
        log_q, emitted = torch.zeros((), dtype=torch.float64), 0
        for t in range(length):
            remaining, left = total - emitted, length - t
            if remaining == 0:  # restriction 2: no high left
                q = torch.zeros((), dtype=torch.float64)
            elif remaining == left:  # restriction 1: every frame left is high
                q = torch.ones((), dtype=torch.float64)
            else:
                q = _high_probability(proposal, logits, t, remaining, length, total, independent)
            log_q = log_q + (torch.log(q) if b[t] else torch.log1p(-q))
            emitted += b[t]
        if torch.isfinite(log_q):
            out[b] = log_q
    return out


def _log_joint(logits, length, rewards, b) -> torch.Tensor:
    """``log P(b) + sum_l rewards[t_l, l]``."""
    zero = torch.zeros((), dtype=torch.float64)
    reward = sum((rewards[t, l] for l, t in enumerate(times_of(b))), zero)
    return _bernoulli_log_prob(logits, b, length) + reward


def evidence_lower_bound(
    proposal, logits, total, length, rewards, independent=None
) -> torch.Tensor:
    """Eq. (46): ``sum_b Q(b) (log P(b) + log P(y | b) - log Q(b))``."""
    q = proposal_log_probs(proposal, logits, total, length, independent)
    return sum(torch.exp(lq) * (_log_joint(logits, length, rewards, b) - lq) for b, lq in q.items())


def multi_sample_bound(proposal, logits, total, length, rewards, independent=None) -> torch.Tensor:
    """Eq. (47) with K = 2: ``sum_{b1, b2} Q(b1) Q(b2) log((r(b1) + r(b2)) / 2)``."""
    q = proposal_log_probs(proposal, logits, total, length, independent)
    log_ratio = {b: _log_joint(logits, length, rewards, b) - lq for b, lq in q.items()}
    total_value = torch.zeros((), dtype=torch.float64)
    for (b1, lq1), (b2, lq2) in itertools.product(q.items(), repeat=2):
        pair = torch.logsumexp(torch.stack([log_ratio[b1], log_ratio[b2]]), 0) - math.log(2)
        total_value = total_value + torch.exp(lq1 + lq2) * pair
    return total_value


def forced_suffix_marginals_by_recursion(p: float, total: int, num_frames: int) -> torch.Tensor:
    """``P(B_t = 1)`` of forced-suffix sampling with i.i.d. ``p``: a forward pass over the
    states (frame, highs so far), each step forced or Bernoulli(p) as section 1 describes."""
    states = {0: 1.0}
    out = []
    for t in range(num_frames):
        high, following = 0.0, {}
        for emitted, mass in states.items():
            remaining, left = total - emitted, num_frames - t
            q = 0.0 if remaining == 0 else 1.0 if remaining == left else p
            high += mass * q
            following[emitted + 1] = following.get(emitted + 1, 0.0) + mass * q
            following[emitted] = following.get(emitted, 0.0) + mass * (1 - q)
        states = following
        out.append(high)
    return torch.tensor(out, dtype=torch.float64)
