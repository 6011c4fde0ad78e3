"""Straight-through CB (CB paper eq. 37) and RELAX/REBAR on the relaxed steps (eq. 36)."""

import pytest
import torch

from cbasr.distributions import PoissonBinomial, id_checking_relaxed
from cbasr.estimators import (
    RELAXATIONS,
    RebarControlVariate,
    cb_expected_reward,
    cb_reinforce,
    relax_cb,
    straight_through_cb,
)
from tests.estimators.cases import assert_unbiased, ragged_batch, replicate


@pytest.mark.parametrize("baseline", [None, "loo"])
@pytest.mark.parametrize("relaxation", RELAXATIONS)
def test_relax_is_unbiased(relaxation, baseline):
    logits, rewards, total, lengths = ragged_batch(60)
    value = cb_expected_reward(logits, total, rewards, lengths)
    exact = torch.autograd.grad(value.sum(), (logits, rewards))
    control = RebarControlVariate(eta=1.3, temperature=0.7, learn=False).double()
    copies, B = 1500, len(total)
    x, r = replicate(logits, copies), replicate(rewards, copies)
    est = relax_cb(
        x,
        total.repeat(copies),
        r,
        lengths.repeat(copies),
        control,
        relaxation,
        2 if baseline else 1,
        baseline,
        torch.Generator().manual_seed(7),
    )
    assert est.control_variate_loss is None  # nothing to learn
    gx, gr = torch.autograd.grad(-est.loss.sum(), (x, r))
    assert_unbiased(gx.view(copies, B, -1), exact[0])
    assert_unbiased(gr.view(copies, B, *rewards.shape[1:]), exact[1])


def test_relax_without_control_variate_is_the_idb_estimator():
    # eta = 0 leaves eq. (23): the same samples (same noise) give the same gradient.
    logits, rewards, total, lengths = ragged_batch(61)
    control = RebarControlVariate(eta=0.0, learn=False).double()
    relax = relax_cb(
        logits,
        total,
        rewards,
        lengths,
        control,
        "id_checking",
        3,
        None,
        torch.Generator().manual_seed(8),
    )
    idb = cb_reinforce(
        logits, total, rewards, lengths, "idb", 3, None, torch.Generator().manual_seed(8)
    )
    assert torch.equal(relax.samples, idb.samples)
    torch.testing.assert_close(
        torch.autograd.grad(relax.loss.sum(), logits), torch.autograd.grad(idb.loss.sum(), logits)
    )


@pytest.mark.parametrize("relaxation", RELAXATIONS)
def test_variance_loss_is_the_squared_gradient_estimate(relaxation):
    logits, rewards, total, lengths = ragged_batch(62)
    control = RebarControlVariate(eta=0.8, temperature=0.6).double()
    est = relax_cb(
        logits,
        total,
        rewards,
        lengths,
        control,
        relaxation,
        2,
        None,
        torch.Generator().manual_seed(9),
    )
    (gradient,) = torch.autograd.grad(-est.loss.sum(), logits, retain_graph=True)
    torch.testing.assert_close(est.control_variate_loss, (gradient**2).sum(-1))
    grads = torch.autograd.grad(est.control_variate_loss.sum(), list(control.parameters()))
    assert all(torch.isfinite(g) and g != 0 for g in grads)


@pytest.mark.parametrize("relaxation", RELAXATIONS)
def test_straight_through_is_the_sample_forward_and_the_relaxation_backward(relaxation):
    logits, rewards, total, lengths = ragged_batch(63)
    est = straight_through_cb(
        logits, total, rewards, lengths, relaxation, 0.5, 3, torch.Generator().manual_seed(10)
    )
    gathered = rewards.gather(1, est.times.clamp(min=0).permute(1, 0, 2)).permute(1, 0, 2)
    per_sample = torch.where(est.times >= 0, gathered, 0.0).sum(-1)
    log_prior = PoissonBinomial(logits, lengths).log_prob(total)
    torch.testing.assert_close(est.value, (log_prior + per_sample.mean(0)).detach())
    if relaxation == "id_checking":  # eq. (37): d/d logits of sum_t z_t R[t, l_t]
        relaxed = id_checking_relaxed(
            logits, total, lengths, 0.5, (3,), torch.Generator().manual_seed(10)
        )
        label = (relaxed.sample.cumsum(-1) - relaxed.sample).long().clamp(max=rewards.shape[2] - 1)
        at = rewards.unsqueeze(0).expand(3, -1, -1, -1).gather(3, label.unsqueeze(-1)).squeeze(-1)
        ok = (label < total[:, None]) & (torch.arange(6) < lengths[:, None])
        surrogate = log_prior + (torch.where(ok, relaxed.relaxed * at, 0.0)).sum(-1).mean(0)
        torch.testing.assert_close(
            torch.autograd.grad(-est.loss.sum(), logits),
            torch.autograd.grad(surrogate.sum(), logits),
        )


@pytest.mark.parametrize("relaxation", RELAXATIONS)
def test_padding_holding_nan_reaches_no_result(relaxation):
    logits, rewards, total, lengths = ragged_batch(65, pad_value=float("nan"))
    control = RebarControlVariate(eta=0.8, temperature=0.6).double()
    for est in (
        relax_cb(
            logits,
            total,
            rewards,
            lengths,
            control,
            relaxation,
            2,
            "loo",
            torch.Generator().manual_seed(1),
        ),
        straight_through_cb(
            logits, total, rewards, lengths, relaxation, 0.5, 2, torch.Generator().manual_seed(1)
        ),
    ):
        grads = torch.autograd.grad(est.loss.sum(), (logits, rewards), retain_graph=True)
        assert torch.isfinite(est.loss).all() and all(torch.isfinite(g).all() for g in grads)
        if est.control_variate_loss is not None:
            assert torch.isfinite(est.control_variate_loss).all()


def test_bad_inputs():
    logits, rewards, total, lengths = ragged_batch(64)
    control = RebarControlVariate()
    callable_rewards = lambda times: torch.zeros(times.shape, dtype=logits.dtype)  # noqa: E731
    with pytest.raises(ValueError, match="relax_cb needs memoryless rewards"):
        relax_cb(logits, total, callable_rewards, lengths, control)
    with pytest.raises(ValueError, match="straight_through_cb needs memoryless rewards"):
        straight_through_cb(logits, total, callable_rewards, lengths)
    with pytest.raises(ValueError, match="relaxation must be one of"):
        straight_through_cb(logits, total, rewards, lengths, relaxation="draft")
    with pytest.raises(ValueError, match="temperature must be positive"):
        RebarControlVariate(temperature=0.0)
