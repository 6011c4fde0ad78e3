"""Variational lower bounds with exactly-L proposals (CB paper eqs. 46-47)."""

import pytest
import torch

from cbasr.distributions import PoissonBinomial
from cbasr.estimators import (
    PROPOSALS,
    cb_expected_reward,
    multi_sample_lower_bound,
    variational_lower_bound,
)
from tests.estimators.cases import assert_unbiased, ragged_batch, replicate
from tests.reference import estimator_enumeration as ref

LENGTHS = [(5, 2), (4, 3)]


def _exact(bound, proposal, logits, rewards, total, lengths, independent):
    values = [
        bound(proposal, logits[b], int(total[b]), int(lengths[b]), rewards[b], independent[b])
        for b in range(len(total))
    ]
    inputs = (logits, rewards, independent) if proposal == "id_checking" else (logits, rewards)
    grads = torch.autograd.grad(sum(values), inputs)
    return torch.stack([v.detach() for v in values]), grads


def _estimate(
    estimator, proposal, logits, rewards, total, lengths, independent, K, baseline, copies=3000
):
    x, r, w = replicate(logits, copies), replicate(rewards, copies), replicate(independent, copies)
    est = estimator(
        x,
        total.repeat(copies),
        r,
        lengths.repeat(copies),
        proposal,
        K,
        baseline,
        w if proposal == "id_checking" else None,
        torch.Generator().manual_seed(5),
    )
    inputs = (x, r, w) if proposal == "id_checking" else (x, r)
    grads = torch.autograd.grad(-est.loss.sum(), inputs)
    B = len(total)
    return est.value.view(copies, B), [g.view(copies, B, *g.shape[1:]) for g in grads]


@pytest.mark.parametrize("baseline", [None, "loo"])
@pytest.mark.parametrize("proposal", PROPOSALS)
def test_elbo_estimate_and_gradient_are_unbiased(proposal, baseline):
    logits, rewards, total, lengths = ragged_batch(50, lengths=LENGTHS)
    independent = torch.randn(
        logits.shape, generator=torch.Generator().manual_seed(51), dtype=logits.dtype
    )
    independent.requires_grad_()
    want_value, want_grads = _exact(
        ref.evidence_lower_bound, proposal, logits, rewards, total, lengths, independent
    )
    M = 2 if baseline else 1
    values, grads = _estimate(
        variational_lower_bound, proposal, logits, rewards, total, lengths, independent, M, baseline
    )
    assert_unbiased(values, want_value)
    for got, want in zip(grads, want_grads):
        assert_unbiased(got, want)


@pytest.mark.parametrize("baseline", [None, "loo"])
@pytest.mark.parametrize("proposal", ["forced_suffix", "binomial"])
def test_two_sample_bound_estimate_and_gradient_are_unbiased(proposal, baseline):
    logits, rewards, total, lengths = ragged_batch(52, lengths=LENGTHS)
    independent = torch.zeros_like(logits)
    want_value, want_grads = _exact(
        ref.multi_sample_bound, proposal, logits, rewards, total, lengths, independent
    )
    elbo, _ = _exact(
        ref.evidence_lower_bound, proposal, logits, rewards, total, lengths, independent
    )
    assert (want_value > elbo).all()  # eq. (47): tighter than eq. (46)
    values, grads = _estimate(
        multi_sample_lower_bound,
        proposal,
        logits,
        rewards,
        total,
        lengths,
        independent,
        2,
        baseline,
    )
    assert_unbiased(values, want_value)
    for got, want in zip(grads, want_grads):
        assert_unbiased(got, want)


def test_cb_proposal_turns_the_elbo_into_the_reinforce_bound():
    # Q = P(b | L): log P(b) - log Q(b) = log P(L) for every sample, so each sample's value is
    # log P(L) + sum_l R (section 3.1), whose mean is eq. (19).
    logits, rewards, total, lengths = ragged_batch(53)
    est = variational_lower_bound(
        logits,
        total,
        rewards,
        lengths,
        "id_checking",
        4000,
        generator=torch.Generator().manual_seed(6),
    )
    gathered = rewards.gather(1, est.times.clamp(min=0).permute(1, 0, 2)).permute(1, 0, 2)
    per_sample = torch.where(est.times >= 0, gathered, 0.0).sum(-1)  # (M, B)
    log_prior = PoissonBinomial(logits, lengths).log_prob(total)
    torch.testing.assert_close(est.value, (log_prior + per_sample.mean(0)).detach())
    exact = cb_expected_reward(logits, total, rewards, lengths).detach()
    assert ((est.value - exact).abs() < 5 * per_sample.std(0) / 4000**0.5 + 1e-9).all()


def test_bad_inputs():
    logits, rewards, total, lengths = ragged_batch(54)
    with pytest.raises(ValueError, match="proposal must be one of"):
        variational_lower_bound(logits, total, rewards, lengths, "cb")
    with pytest.raises(ValueError, match="baseline must be None or 'loo'"):
        variational_lower_bound(logits, total, rewards, lengths, "binomial", 2, baseline="running")
    with pytest.raises(ValueError, match="loo.*num_samples >= 2"):
        multi_sample_lower_bound(logits, total, rewards, lengths, "binomial", 1)
    with pytest.raises(ValueError, match=r"total\[2\] = 5 > input_lengths\[2\] = 4"):
        multi_sample_lower_bound(
            logits, torch.tensor([3, 2, 5, 3]), rewards, lengths, "binomial", 2
        )
