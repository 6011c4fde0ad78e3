"""Forced-suffix sampling (CB paper eq. 48), its bias (eq. 3, Figure 1) and REINFORCE (eq. 1)."""

import math

import pytest
import torch

from cbasr.estimators import (
    forced_suffix_marginals,
    forced_suffix_reinforce,
    forced_suffix_sample,
)
from tests.estimators.cases import F64, assert_unbiased, ragged_batch, replicate
from tests.reference import estimator_enumeration as ref


@pytest.mark.parametrize(
    "p,L,T", [(0.5, 3, 10), (0.2, 2, 9), (0.8, 5, 8), (0.5, 6, 8), (0.3, 0, 5), (0.6, 5, 5)]
)
def test_eq3_matches_the_forced_process(p, L, T):
    # Against a forward pass over (frame, highs) and, for small T, every sequence.
    want = ref.forced_suffix_marginals_by_recursion(p, L, T)
    torch.testing.assert_close(forced_suffix_marginals(p, L, T), want, rtol=0, atol=1e-12)
    logits = torch.full((T,), math.log(p / (1 - p)), dtype=F64)
    q = ref.proposal_log_probs("forced_suffix", logits, L, T)
    by_enumeration = sum(torch.exp(lq) * torch.tensor(b, dtype=F64) for b, lq in q.items())
    torch.testing.assert_close(want, by_enumeration, rtol=0, atol=1e-12)


def test_eq3_is_not_the_cb_inclusion_probability():
    # The bias of section 1: P*(B_t = 1) is p on the first L frames, not L / T.
    marginals = forced_suffix_marginals(0.5, 38, 100)
    assert torch.allclose(marginals[:38], torch.tensor(0.5, dtype=F64))
    assert marginals[-10:].max() < 0.1 and abs(float(marginals.sum()) - 38) < 1e-9


def test_sampler_reproduces_eq3_for_figure_1():
    # T = 100, L = 38, p = 0.5: the empirical P(B_t = 1) within Monte Carlo error of eq. (3).
    M = 20000
    samples, _ = forced_suffix_sample(
        torch.zeros(1, 100), 38, None, M, torch.Generator().manual_seed(0)
    )
    assert torch.equal(samples.sum(-1), torch.full((M, 1), 38.0))
    want = forced_suffix_marginals(0.5, 38, 100)
    empirical = samples.mean((0, 1)).double()
    standard_error = (want * (1 - want) / M).sqrt() + 1 / M
    assert ((empirical - want).abs() / standard_error).max() < 4.5


def test_step_log_probs_are_those_of_eq48_and_samples_follow_it():
    logits = torch.randn(1, 6, generator=torch.Generator().manual_seed(1), dtype=F64)
    q = ref.proposal_log_probs("forced_suffix", logits[0], 2, 6)
    samples, steps = forced_suffix_sample(logits, 2, None, 6000, torch.Generator().manual_seed(2))
    cells = list(q)
    hits = (samples[:, 0].unsqueeze(1) == torch.tensor(cells, dtype=F64)).all(-1)  # (M, cells)
    assert bool(hits.any(-1).all())
    for index in range(len(cells)):  # the steps of each sampled sequence sum to log Q_FS(b)
        rows = hits[:, index].nonzero()[:5, 0]
        torch.testing.assert_close(steps[rows, 0].sum(-1), q[cells[index]].expand(len(rows)))
    counts = hits.sum(0).double()
    expected = torch.stack([q[c] for c in cells]).exp() * len(samples)
    statistic = float(((counts - expected) ** 2 / expected).sum())
    p_value = float(
        torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2.0), torch.tensor(statistic / 2))
    )
    assert p_value > 1e-3


def _objective(logits, rewards, total, length, entropy_weight):
    """E_{b ~ Q_FS}[sum_l R] + lambda sum_t H(B_t), by enumeration."""
    q = ref.proposal_log_probs("forced_suffix", logits, total, length)
    zero = torch.zeros((), dtype=F64)
    value = sum(
        torch.exp(lq) * sum((rewards[t, l] for l, t in enumerate(ref.times_of(b))), zero)
        for b, lq in q.items()
    )
    p = torch.sigmoid(logits[:length])
    entropy = -(p * torch.log(p) + (1 - p) * torch.log1p(-p)).sum()
    return value + entropy_weight * entropy


@pytest.mark.parametrize("baseline", [None, "loo"])
def test_reinforce_is_unbiased_for_its_own_objective_and_biased_for_the_cb(baseline):
    logits, rewards, total, lengths = ragged_batch(30, lengths=[(6, 2), (5, 3)])
    weight = 0.3
    want = [
        torch.autograd.grad(
            _objective(logits[b], rewards[b], int(total[b]), int(lengths[b]), weight),
            (logits, rewards),
        )
        for b in range(2)
    ]
    want = tuple(sum(w[i] for w in want) for i in range(2))
    copies = 3000
    x, r = replicate(logits, copies), replicate(rewards, copies)
    est = forced_suffix_reinforce(
        x,
        total.repeat(copies),
        r,
        lengths.repeat(copies),
        2 if baseline else 1,
        baseline,
        weight,
        torch.Generator().manual_seed(3),
    )
    gx, gr = torch.autograd.grad(-est.loss.sum(), (x, r))
    assert_unbiased(gx.view(copies, 2, 6), want[0])
    assert_unbiased(gr.view(copies, *rewards.shape), want[1])
    # With p = 1/2 and a reward that grows with t, the CB expectation (every pair of frames
    # equally likely, E[t_1 + t_2] = 5) and the forced-suffix one (early highs) differ: the
    # bias of section 1.
    flat, late = torch.zeros(6, dtype=F64), torch.arange(6, dtype=F64).unsqueeze(-1).expand(6, 2)
    cb = ref.expected_reward(flat, 2, 6, late) - ref.log_prior(flat, 2, 6)
    fs = _objective(flat, late, 2, 6, 0.0)
    torch.testing.assert_close(cb, torch.tensor(5.0, dtype=F64))
    assert float(fs) < 4.0


def test_bad_inputs_name_the_argument():
    logits, rewards, total, lengths = ragged_batch(31)
    with pytest.raises(ValueError, match=r"total\[0\] = 7 > lengths\[0\] = 6"):
        forced_suffix_sample(logits, torch.tensor([7, 1, 0, 1]), lengths)
    with pytest.raises(ValueError, match="entropy_weight"):
        forced_suffix_reinforce(logits, total, rewards, lengths, 2, entropy_weight=-1.0)
    with pytest.raises(ValueError, match=r"total\[1\] = 6 > input_lengths\[1\] = 5"):
        forced_suffix_reinforce(logits, torch.tensor([3, 6, 0, 3]), rewards, lengths, 2)
    with pytest.raises(ValueError, match="total must lie"):
        forced_suffix_marginals(0.5, 11, 10)
    with pytest.raises(ValueError, match="p must lie"):
        forced_suffix_marginals(1.5, 3, 10)


@pytest.mark.parametrize("baseline", ["loo", "running", "learned"])
def test_constant_rewards_give_no_score_function_gradient(baseline):
    """Eq. (1) has no log P(L) term: with the same reward for every label and a baseline at
    that reward per label, the gradient w.r.t. the emission logits is exactly 0 (to rounding)."""
    from cbasr.estimators import RunningMeanBaseline

    logits, _, total, lengths = ragged_batch(4)
    B, T = logits.shape
    rewards = torch.full((B, T, 3), -1.7, dtype=F64)
    if baseline == "running":
        chosen = RunningMeanBaseline(decay=0.5).double()
        chosen.update(torch.full((1, 1, 1), -1.7, dtype=F64), torch.ones(1, 1, 1, dtype=torch.bool))
    else:
        chosen = "loo" if baseline == "loo" else torch.full((B,), -1.7, dtype=F64)
    est = forced_suffix_reinforce(
        logits, total, rewards, lengths, 4, chosen, generator=torch.Generator().manual_seed(2)
    )
    (g,) = torch.autograd.grad(-est.loss.sum(), logits)
    torch.testing.assert_close(g, torch.zeros_like(g), rtol=0, atol=1e-13)
