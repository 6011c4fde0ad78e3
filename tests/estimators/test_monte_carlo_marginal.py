"""cb_monte_carlo_marginal: the Monte Carlo CB marginal with VIMCO's gradient, against
enumerations of every tuple of samples and of every emission sequence (float64)."""

import itertools
import math

import pytest
import torch

from cbasr.distributions import PoissonBinomial
from cbasr.estimators import cb_monte_carlo_marginal, cb_monte_carlo_marginal_from_samples
from cbasr.estimators.baselines import vimco_signals
from cbasr.losses import cb_marginal_nll
from tests.estimators.cases import F64, assert_unbiased, ragged_batch, replicate
from tests.reference import cb_enumeration as cb_ref
from tests.reference import estimator_enumeration as ref


def _log_weight(rewards, times) -> torch.Tensor:
    """``log P(y | b) = sum_l R[t_l, l]`` for one utterance's ``rewards (T, L)``."""
    return sum((rewards[t, l] for l, t in enumerate(times)), torch.zeros((), dtype=F64))


def _exact_marginal(logits, rewards, total, length) -> torch.Tensor:
    """``log P(y | L) = log P(L) + log sum_b P(b | L) P(y | b)`` over every emission sequence."""
    support, log_probs = cb_ref.cb_log_probs(logits, total, length)
    terms = [lp + _log_weight(rewards, ref.times_of(b)) for b, lp in zip(support, log_probs)]
    return ref.log_prior(logits, total, length) + torch.logsumexp(torch.stack(terms), 0)


def _expected_bound(logits, rewards, total, length, M) -> torch.Tensor:
    """``E[log P(L) + log mean_m P(y | b_m)]`` over every ``M``-tuple of CB samples, with the CB
    probabilities and the prior from their definitions: differentiable, no sampling."""
    support, log_probs = cb_ref.cb_log_probs(logits, total, length)
    f = [_log_weight(rewards, ref.times_of(b)) for b in support]
    value = torch.zeros((), dtype=F64)
    for chosen in itertools.product(range(len(support)), repeat=M):
        weight = torch.exp(sum(log_probs[i] for i in chosen))
        value = value + weight * (
            torch.logsumexp(torch.stack([f[i] for i in chosen]), 0) - math.log(M)
        )
    return ref.log_prior(logits, total, length) + value


def _expected_estimate(logits, rewards, total, length, M):
    """``sum over M-tuples of P(tuple) * (value, gradient estimate)``: the estimator's exact mean."""
    L = rewards.shape[2]
    support, log_probs = cb_ref.cb_log_probs(logits[0].detach(), int(total), int(length))
    times = torch.tensor([list(ref.times_of(b)) + [-1] * (L - int(total)) for b in support])
    value, grads = torch.zeros((), dtype=F64), [torch.zeros_like(logits), torch.zeros_like(rewards)]
    for chosen in itertools.product(range(len(support)), repeat=M):
        weight = torch.exp(sum(log_probs[i] for i in chosen))
        est = cb_monte_carlo_marginal_from_samples(
            logits, total, rewards, length, times[list(chosen)].unsqueeze(1)
        )
        g = torch.autograd.grad(-est.loss.sum(), (logits, rewards))
        value = value + weight * est.value.sum()
        grads = [a + weight * b for a, b in zip(grads, g)]
    return value, grads


@pytest.mark.parametrize("M", [2, 3])
def test_mean_estimate_is_the_gradient_of_the_expected_bound(M):
    """Summed over every M-tuple of samples, the value is E[log P^_M] and the VIMCO gradient is
    exactly its gradient (w.r.t. both the emission logits and the rewards): unbiased."""
    T, total, length = 5, 2, 4
    g = torch.Generator().manual_seed(3)
    logits = (1.5 * torch.randn(1, T, generator=g, dtype=F64)).requires_grad_()
    rewards = (-2.0 * torch.rand(1, T, total, generator=g, dtype=F64)).requires_grad_()
    oracle = _expected_bound(logits[0], rewards[0], total, length, M)
    exact = torch.autograd.grad(oracle, (logits, rewards))
    value, grads = _expected_estimate(
        logits, rewards, torch.tensor([total]), torch.tensor([length]), M
    )
    torch.testing.assert_close(value, oracle.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grads[0], exact[0], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grads[1], exact[1], rtol=1e-9, atol=1e-10)


def test_the_bound_rises_to_the_exact_marginal_as_samples_grow():
    """E[log P^_M] <= log P(y | L) (the exact marginal of eq. 38, by enumeration), and the gap
    shrinks as M grows (about like 1/M); at M = 2048 value and gradient are those of the marginal."""
    logits, rewards, total, lengths = ragged_batch(5)
    B, T = logits.shape
    exact = torch.stack(
        [_exact_marginal(logits[b], rewards[b], int(total[b]), int(lengths[b])) for b in range(B)]
    )
    # the oracle itself agrees with the package's exact marginal (same label terms per frame)
    marginal = -cb_marginal_nll(logits, rewards, lengths, total)
    torch.testing.assert_close(marginal, exact, rtol=1e-10, atol=1e-10)
    generator = torch.Generator().manual_seed(7)
    gaps = {}
    for M, copies in [(2, 4000), (16, 1000), (128, 300)]:
        est = cb_monte_carlo_marginal(
            replicate(logits, copies),
            total.repeat(copies),
            replicate(rewards, copies),
            lengths.repeat(copies),
            M,
            generator,
        )
        values = est.value.view(copies, B)
        gap = exact.detach() - values.mean(0)
        noise = values.std(0) / copies**0.5
        assert bool((gap > -5 * noise - 1e-12).all()), (M, gap, noise)  # a lower bound
        gaps[M] = float(gap.sum())
    assert gaps[16] < gaps[2] / 4 and gaps[128] < gaps[16] / 4, gaps
    M, copies = 2048, 200
    x, r = replicate(logits, copies), replicate(rewards, copies)
    est = cb_monte_carlo_marginal(x, total.repeat(copies), r, lengths.repeat(copies), M, generator)
    gx, gr = torch.autograd.grad(-est.loss.sum(), (x, r))
    exact_gx, exact_gr = torch.autograd.grad(exact.sum(), (logits, rewards))
    torch.testing.assert_close(est.value.view(copies, B).mean(0), exact.detach(), atol=2e-3, rtol=0)
    torch.testing.assert_close(gx.view(copies, B, T).mean(0), exact_gx, atol=2e-2, rtol=0)
    torch.testing.assert_close(
        gr.view(copies, B, *rewards.shape[1:]).mean(0), exact_gr, atol=2e-2, rtol=0
    )


def test_sampled_mean_gradient_matches_the_enumerated_one():
    """The sampler and the estimator together: the mean over many draws of M = 3 samples is
    within Monte Carlo error of the enumerated expectation (1/sqrt(R) tolerance)."""
    T, total, length, M = 5, 2, 4, 3
    g = torch.Generator().manual_seed(4)
    logits = (1.5 * torch.randn(1, T, generator=g, dtype=F64)).requires_grad_()
    rewards = (-2.0 * torch.rand(1, T, total, generator=g, dtype=F64)).requires_grad_()
    exact = torch.autograd.grad(_expected_bound(logits[0], rewards[0], total, length, M), logits)[0]
    copies = 20000
    x = replicate(logits, copies)
    est = cb_monte_carlo_marginal(
        x,
        torch.full((copies,), total),
        replicate(rewards, copies).detach(),
        torch.full((copies,), length),
        M,
        torch.Generator().manual_seed(8),
    )
    (gx,) = torch.autograd.grad(-est.loss.sum(), x)
    assert_unbiased(gx.view(copies, 1, T), exact)


def test_constant_rewards_give_no_score_function_gradient():
    """With log P(y | b) the same for every sample, every VIMCO signal is exactly 0: the
    gradient w.r.t. the emission logits is that of log P(L) alone."""
    logits, _, total, lengths = ragged_batch(2)
    rewards = torch.full((logits.shape[0], logits.shape[1], 3), -1.7, dtype=F64)
    est = cb_monte_carlo_marginal(
        logits, total, rewards, lengths, 8, torch.Generator().manual_seed(0)
    )
    (g,) = torch.autograd.grad(-est.loss.sum(), logits)
    (prior,) = torch.autograd.grad(PoissonBinomial(logits, lengths).log_prob(total).sum(), logits)
    assert torch.equal(g, prior)
    assert torch.equal(vimco_signals(torch.full((5, 3), -2.3)), torch.zeros(5, 3))


def test_vimco_signal_is_the_log_mean_exp_minus_its_leave_one_out_version():
    f = torch.tensor([[-1.0, 0.0], [-3.0, 2.0], [-0.5, 1.0]], dtype=F64)  # (M, B)
    M = 3
    full = torch.logsumexp(f, 0) - math.log(M)
    for m in range(M):
        replaced = f.clone()
        replaced[m] = (f.sum(0) - f[m]) / (M - 1)
        torch.testing.assert_close(
            vimco_signals(f)[m], full - (torch.logsumexp(replaced, 0) - math.log(M))
        )


def test_vimco_signals_are_finite_for_far_apart_weights():
    """Log weights hundreds of nats apart (a long utterance, one good sample): the
    leave-one-out terms must not underflow to log 0 (a sum of exponentials would)."""
    f = torch.tensor([[0.0], [-200.0], [-350.0], [-90.0]])
    got = vimco_signals(f)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, vimco_signals(f.double()).float())
    # the best sample's signal: log-mean-exp with it against the one with the others' mean
    expected = torch.logsumexp(f[:, 0], 0) - torch.logsumexp(
        torch.tensor([(-200 - 350 - 90) / 3, -200, -350, -90]), 0
    )
    torch.testing.assert_close(got[0, 0], expected)


def test_callable_rewards_and_padding():
    """A callable reward (label terms that read the emission times) gives the same estimate as
    the equivalent tensor; padded frames and labels change nothing."""
    logits, rewards, total, lengths = ragged_batch(6, pad_value=float("nan"))
    clean, clean_rewards, _, _ = ragged_batch(6, pad_value=0.0)

    def reward_fn(times):  # (M, B, L) -> (M, B, L), gathered by hand
        M, B, L = times.shape
        at = times.clamp(min=0)
        return torch.stack(
            [
                torch.stack([clean_rewards[b, at[m, b], torch.arange(L)] for b in range(B)])
                for m in range(M)
            ]
        )

    a = cb_monte_carlo_marginal(
        logits, total, rewards, lengths, 4, torch.Generator().manual_seed(1)
    )
    b = cb_monte_carlo_marginal(
        clean, total, reward_fn, lengths, 4, torch.Generator().manual_seed(1)
    )
    assert torch.equal(a.times, b.times)
    torch.testing.assert_close(a.value, b.value)
    assert torch.isfinite(torch.autograd.grad(a.loss.sum(), logits)[0]).all()


def test_refuses_a_single_sample():
    logits, rewards, total, lengths = ragged_batch(0)
    with pytest.raises(ValueError, match="num_samples must be >= 2"):
        cb_monte_carlo_marginal(logits, total, rewards, lengths, 1)
