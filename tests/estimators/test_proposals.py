"""Proposals Q_FS, Q_IDB, Q_Bin (CB paper eqs. 48, 50, 51) and the step-wise sampler."""

import math

import pytest
import torch
import torch.nn.functional as F

from cbasr.distributions import id_checking_log_probs
from cbasr.estimators import PROPOSALS, ProposalSampler, proposal_sample
from tests.estimators.cases import F64
from tests.reference import estimator_enumeration as ref


def _chi_square_p_value(samples, q):
    cells = list(q)
    hits = (samples.unsqueeze(1) == torch.tensor(cells, dtype=samples.dtype)).all(-1)  # (M, cells)
    assert bool(hits.any(-1).all()), "a sample outside the proposal's support"
    counts = hits.sum(0).double()
    expected = torch.stack([q[c] for c in cells]).exp() * len(samples)
    statistic = ((counts - expected) ** 2 / expected).sum()
    return float(
        torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2.0, dtype=F64), statistic / 2)
    )


@pytest.mark.parametrize("proposal", PROPOSALS)
@pytest.mark.parametrize("total,length", [(2, 6), (3, 5), (1, 4)])
def test_steps_and_samples_match_the_definitions(proposal, total, length):
    g = torch.Generator().manual_seed(40 + total)
    logits = torch.randn(1, 6, generator=g, dtype=F64)
    independent = torch.randn(1, 6, generator=g, dtype=F64)
    q = ref.proposal_log_probs(proposal, logits[0], total, length, independent[0])
    assert abs(float(torch.stack(list(q.values())).exp().sum()) - 1) < 1e-12
    samples, steps = proposal_sample(
        proposal,
        logits,
        total,
        torch.tensor([length]),
        4000,
        torch.Generator().manual_seed(1),
        independent,
    )
    samples = samples[:, 0]
    assert torch.equal(samples.sum(-1), torch.full((4000,), float(total), dtype=F64))
    assert not samples[:, length:].any() and not steps[:, 0, length:].any()
    for row in range(20):  # the steps of every sample add up to log Q(b)
        torch.testing.assert_close(steps[row, 0].sum(), q[tuple(int(v) for v in samples[row])])
    assert _chi_square_p_value(samples, q) > 1e-3


def test_id_checking_proposal_with_its_own_logits_is_the_cb():
    # Eq. (50) with w' = w is the ID-checking step of eq. (11).
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(41), dtype=F64)
    total, lengths = torch.tensor([3, 1, 5]), torch.tensor([7, 6, 5])
    samples, steps = proposal_sample(
        "id_checking", logits, total, lengths, 50, torch.Generator().manual_seed(2)
    )
    torch.testing.assert_close(steps, id_checking_log_probs(logits, total, samples, lengths))


@pytest.mark.parametrize("proposal", PROPOSALS)
def test_step_log_probs_are_differentiable(proposal):
    logits = torch.randn(
        2, 6, generator=torch.Generator().manual_seed(42), dtype=F64
    ).requires_grad_()
    independent = torch.randn(
        2, 6, generator=torch.Generator().manual_seed(43), dtype=F64
    ).requires_grad_()
    total = torch.tensor([2, 4])
    _, steps = proposal_sample(
        proposal, logits, total, None, 30, torch.Generator().manual_seed(3), independent
    )
    inputs = (logits, independent) if proposal == "id_checking" else (logits,)
    grads = torch.autograd.grad(steps.sum(), inputs)
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_binomial_proposal_closed_form():
    # Eq. (51), second line: odds w_t (T - L)(L - l) / (L (T - t - L + l + 1)), 1-based t.
    T, L = 9, 4
    logits = torch.randn(1, T, generator=torch.Generator().manual_seed(44), dtype=F64)
    sampler = ProposalSampler("binomial", torch.tensor([L]), torch.tensor([T]), T)
    for t in range(T):
        emitted = int(sampler.emitted[0])
        odds = sampler.log_odds(logits[:, t])
        t1, left = t + 1, L - emitted
        if left == 0 or left == T - t:
            assert torch.isinf(odds).all()
        else:
            want = (
                logits[0, t] + math.log((T - L) * left) - math.log(L * (T - t1 - L + emitted + 1))
            )
            torch.testing.assert_close(odds[0], want)
        sampler.step(logits[:, t])


def test_step_wise_sampler_with_autoregressive_logits():
    # log odds that depend on the previous sample: the distribution is the product of the
    # proposal's steps along each sequence, for every proposal meeting restrictions 1-2.
    T, L, M = 6, 2, 6000
    base = torch.randn(T, generator=torch.Generator().manual_seed(45), dtype=F64)
    sampler = ProposalSampler(
        "forced_suffix",
        torch.full((M,), L),
        torch.full((M,), T),
        T,
        generator=torch.Generator().manual_seed(4),
    )
    previous = torch.zeros(M, dtype=F64)
    drawn, log_q = [], torch.zeros(M, dtype=F64)
    for t in range(T):
        b, lp = sampler.step(base[t] - 2.0 * previous)  # a high makes the next one rarer
        drawn.append(b)
        log_q += lp
        previous = b
    samples = torch.stack(drawn, -1)
    assert torch.equal(samples.sum(-1), torch.full((M,), float(L), dtype=F64))
    q = {}
    for b in {tuple(int(v) for v in row) for row in samples}:
        steps = torch.zeros((), dtype=F64)
        emitted, prev = 0, 0
        for t in range(T):
            left = L - emitted
            if left == 0 or left == T - t:
                step = torch.zeros((), dtype=F64)
            else:
                step = F.logsigmoid((1 if b[t] else -1) * (base[t] - 2.0 * prev))
            steps, emitted, prev = steps + step, emitted + b[t], b[t]
        q[b] = steps
    for row in range(10):
        torch.testing.assert_close(log_q[row], q[tuple(int(v) for v in samples[row])])
    assert abs(float(torch.stack(list(q.values())).exp().sum()) - 1) < 1e-9  # all support seen
    assert _chi_square_p_value(samples, q) > 1e-3


def test_bad_inputs():
    with pytest.raises(ValueError, match="proposal must be one of"):
        ProposalSampler("luo", torch.tensor([1]), torch.tensor([3]), 3)
    with pytest.raises(ValueError, match=r"total\[0\] = 4 > lengths\[0\] = 3"):
        ProposalSampler("binomial", torch.tensor([4]), torch.tensor([3]), 3)
    with pytest.raises(ValueError, match="independent_logits"):
        ProposalSampler("id_checking", torch.tensor([1]), torch.tensor([3]), 3)
    sampler = ProposalSampler("forced_suffix", torch.tensor([1]), torch.tensor([1]), 1)
    sampler.step(torch.zeros(1))
    with pytest.raises(RuntimeError, match="all 1 frames"):
        sampler.step(torch.zeros(1))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_forced_suffix_at_once_is_the_step_wise_sampler(dtype):
    """proposal_sample's forced suffix, every frame at once, against ProposalSampler's frame
    by frame on the same noise (a CPU generator draws (T, N) as T draws of N): the same
    samples, step log probabilities and gradient, with none, some and all frames high, padding,
    a run forced high and +-inf log odds."""
    g = torch.Generator().manual_seed(44)
    B, T, M = 6, 9, 40
    logits = 2 * torch.randn(B, T, generator=g, dtype=dtype)
    logits[4, 2], logits[5, 0], logits[5, 4] = math.inf, -math.inf, math.inf
    logits.requires_grad_()
    total, lengths = torch.tensor([0, 3, 7, 9, 2, 3]), torch.tensor([9, 5, 7, 9, 8, 6])
    samples, steps = proposal_sample(
        "forced_suffix", logits, total, lengths, M, torch.Generator().manual_seed(5)
    )
    sampler = ProposalSampler(
        "forced_suffix", total.repeat(M), lengths.repeat(M), T,
        generator=torch.Generator().manual_seed(5),
    )  # fmt: skip
    flat = logits.unsqueeze(0).expand(M, B, T).reshape(M * B, T)
    draws = [sampler.step(column) for column in flat.unbind(1)]
    want = torch.stack([b for b, _ in draws], -1).reshape(M, B, T)
    want_steps = torch.stack([lp for _, lp in draws], -1).reshape(M, B, T)
    assert samples.dtype == dtype and torch.equal(samples, want)
    assert torch.equal(samples.sum(-1), total.to(dtype).expand(M, B))
    # some rows were forced high before their last frame, and row 2 (L = T_b) from its first
    assert (samples[:, 2, :7] == 1).all() and not samples[:, :, 7:][:, 2].any()
    torch.testing.assert_close(steps, want_steps, rtol=0, atol=0)
    assert not steps[:, 0].any() and not steps[:, 3].any()  # every step forced
    weights = torch.randn(M, B, T, generator=g, dtype=dtype)
    got_grad = torch.autograd.grad((weights * steps).sum(), logits)[0]
    want_grad = torch.autograd.grad((weights * want_steps).sum(), logits)[0]
    torch.testing.assert_close(got_grad, want_grad)
    assert got_grad[1].abs().sum() > 0 and not got_grad[0].any()
