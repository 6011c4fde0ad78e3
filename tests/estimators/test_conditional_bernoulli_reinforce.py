"""cb_reinforce: the global, ID-checking, bounded and marginal bounded REINFORCE estimators
(CB paper eqs. 21, 23, 28, 29) and their baselines, against the exact gradient of eq. (19)."""

import itertools

import pytest
import torch

from cbasr.distributions import PoissonBinomial
from cbasr.estimators import (
    ESTIMATORS,
    LearnedBaseline,
    RunningMeanBaseline,
    cb_expected_reward,
    cb_reinforce,
    cb_reinforce_from_samples,
)
from tests.estimators.cases import F64, assert_unbiased, ragged_batch, replicate
from tests.reference import cb_enumeration as cb_ref
from tests.reference import estimator_enumeration as ref


def _exact_gradients(logits, rewards, total, lengths):
    value = cb_expected_reward(logits, total, rewards, lengths)
    return torch.autograd.grad(value.sum(), (logits, rewards))


@pytest.mark.parametrize("baseline", [None, "loo"])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_mean_gradient_approaches_the_exact_gradient(estimator, baseline, device):
    logits, rewards, total, lengths = ragged_batch(10, device=device)
    exact = _exact_gradients(logits, rewards, total, lengths)
    copies, B = 5000, len(total)
    x, r = replicate(logits, copies), replicate(rewards, copies)
    generator = torch.Generator(device=device).manual_seed(11)
    M = 2 if baseline == "loo" else 1
    est = cb_reinforce(
        x, total.repeat(copies), r, lengths.repeat(copies), estimator, M, baseline, generator
    )
    gx, gr = torch.autograd.grad(-est.loss.sum(), (x, r))
    assert_unbiased(gx.view(copies, B, -1), exact[0])
    assert_unbiased(gr.view(copies, B, *rewards.shape[1:]), exact[1])


def _support_times(T, total, length, L):
    support, log_probs = cb_ref.cb_log_probs(torch.zeros(T, dtype=F64), total, length)
    times = [list(ref.times_of(b)) + [-1] * (L - total) for b in support]
    return torch.tensor(times), support


def _expected_estimate(logits, rewards, total, length, estimator, baseline_factory, M=1):
    """``sum over M-tuples of CB samples of P(tuple) * gradient estimate``: exact, no sampling."""
    T, L = logits.shape[1], rewards.shape[2]
    times, support = _support_times(T, int(total), int(length), L)
    _, log_probs = cb_ref.cb_log_probs(logits[0].detach(), int(total), int(length))
    grads = torch.zeros_like(logits)
    for tuple_index in itertools.product(range(len(support)), repeat=M):
        chosen = times[list(tuple_index)].unsqueeze(1)  # (M, 1, L)
        weight = torch.exp(sum(log_probs[i] for i in tuple_index))
        est = cb_reinforce_from_samples(
            logits, total, rewards, length, estimator, chosen, baseline_factory()
        )
        (g,) = torch.autograd.grad(-est.loss.sum(), logits)
        grads = grads + weight * g
    return grads


def _running_mean_at(value):
    baseline = RunningMeanBaseline(decay=0.5).double()
    baseline.update(torch.full((1, 1, 1), value, dtype=F64), torch.ones(1, 1, 1, dtype=torch.bool))
    return baseline


BASELINES = {
    "none": (lambda: None, 1),
    "loo": (lambda: "loo", 2),
    "running": (lambda: _running_mean_at(-1.7), 1),
    "learned": (lambda: torch.tensor([0.9], dtype=F64), 1),
}


@pytest.mark.parametrize("baseline", list(BASELINES))
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_expected_estimate_over_every_sample_is_the_exact_gradient(estimator, baseline):
    # Unbiasedness without Monte Carlo error: sum_b P(b | L) g(b) over the whole support
    # (over pairs for leave-one-out). A baseline that leaked the sample would break it.
    logits, rewards, total, lengths = ragged_batch(12, lengths=[(5, 2)])
    factory, M = BASELINES[baseline]
    got = _expected_estimate(logits, rewards, total, lengths, estimator, factory, M)
    exact = _exact_gradients(logits, rewards, total, lengths)[0]
    torch.testing.assert_close(got, exact, rtol=1e-9, atol=1e-11)


def test_idb_and_bb_estimates_are_identical_per_sample():
    # Eq. (28) "yields identical sample estimates as eq. (23)".
    logits, rewards, total, lengths = ragged_batch(13)
    generator = torch.Generator().manual_seed(0)
    times = cb_reinforce(logits, total, rewards, lengths, "bb", 5, generator=generator).times
    grads = []
    for estimator in ("idb", "bb"):
        est = cb_reinforce_from_samples(logits, total, rewards, lengths, estimator, times)
        grads.append(torch.autograd.grad(est.loss.sum(), (logits, rewards)))
    torch.testing.assert_close(grads[0], grads[1])
    est = cb_reinforce_from_samples(logits, total, rewards, lengths, "global", times)
    global_grad = torch.autograd.grad(est.loss.sum(), logits)[0]
    assert (global_grad - grads[0][0]).abs().max() > 1e-3  # eq. (21) differs per sample


def _history_rewards(weights):
    """A non-memoryless reward: label l earns ``weights[t_l, t_{l-1} + 1]`` (t_{-1} = -1)."""

    def rewards(times):
        previous = torch.nn.functional.pad(times[..., :-1], (1, 0), value=-1)
        return weights[times.clamp(min=0), previous.clamp(min=-1) + 1]

    return rewards


@pytest.mark.parametrize("estimator", ["global", "idb", "bb"])
def test_callable_rewards_that_look_at_earlier_times(estimator):
    logits = torch.randn(
        1, 5, generator=torch.Generator().manual_seed(14), dtype=F64
    ).requires_grad_()
    weights = -torch.rand(5, 6, generator=torch.Generator().manual_seed(15), dtype=F64)
    weights.requires_grad_()
    total, length = torch.tensor([3]), torch.tensor([5])

    def f(times):
        previous = (-1,) + times[:-1]
        return sum(weights[t, p + 1] for t, p in zip(times, previous))

    want = torch.autograd.grad(ref.expected_function(logits[0], 3, 5, f), (logits, weights))
    # Exactly, over the support ...
    times, support = _support_times(5, 3, 5, 3)
    _, log_probs = cb_ref.cb_log_probs(logits[0].detach(), 3, 5)
    got = [torch.zeros_like(logits), torch.zeros_like(weights)]
    for row, lp in zip(times, log_probs):
        est = cb_reinforce_from_samples(
            logits, total, _history_rewards(weights), length, estimator, row.view(1, 1, 3)
        )
        for acc, g in zip(got, torch.autograd.grad(-est.loss.sum(), (logits, weights))):
            acc += torch.exp(lp) * g
    torch.testing.assert_close(tuple(got), want, rtol=1e-9, atol=1e-11)
    # ... and by sampling.
    copies = 2000
    x = replicate(logits, copies)
    est = cb_reinforce(
        x,
        total.repeat(copies),
        _history_rewards(weights),
        length.repeat(copies),
        estimator,
        1,
        generator=torch.Generator().manual_seed(16),
    )
    (gx,) = torch.autograd.grad(-est.loss.sum(), x)
    assert_unbiased(gx.view(copies, 1, 5), want[0])


def test_value_is_the_sampled_objective_and_the_loss_its_negative():
    logits, rewards, total, lengths = ragged_batch(17)
    est = cb_reinforce(
        logits, total, rewards, lengths, "mbb", 3, generator=torch.Generator().manual_seed(1)
    )
    assert est.samples.shape == (3, 4, 6) and est.times.shape == (3, 4, 3)
    assert torch.equal(est.samples.sum(-1), total.to(F64).expand(3, 4))
    gathered = rewards.gather(1, est.times.clamp(min=0).permute(1, 0, 2)).permute(
        1, 0, 2
    )  # (M, B, L)
    per_sample = torch.where(est.times >= 0, gathered, 0.0).sum(-1)
    log_prior = PoissonBinomial(logits, lengths).log_prob(total)
    torch.testing.assert_close(est.value, log_prior + per_sample.mean(0).detach())
    torch.testing.assert_close(est.loss, -est.value)


def test_padding_changes_nothing():
    logits, rewards, total, lengths = ragged_batch(18)
    padded = ragged_batch(18, pad_value=float("nan"))
    times = cb_reinforce(
        logits, total, rewards, lengths, "idb", 4, generator=torch.Generator().manual_seed(2)
    ).times
    for estimator in ESTIMATORS:
        results = []
        for x, r in ((logits, rewards), padded[:2]):
            est = cb_reinforce_from_samples(x, total, r, lengths, estimator, times, "loo")
            grads = torch.autograd.grad(est.loss.sum(), (x, r))
            results.append(
                (
                    est.loss,
                    *(
                        torch.where(torch.isnan(p), 0.0, g)
                        for p, g in zip((padded[0], padded[1]), grads)
                    ),
                )
            )
        torch.testing.assert_close(results[0], results[1])


def test_running_mean_baseline_uses_past_batches_only():
    logits, rewards, total, lengths = ragged_batch(19)
    baseline = RunningMeanBaseline(decay=0.5).double()
    est = cb_reinforce(
        logits, total, rewards, lengths, "mbb", 2, baseline, torch.Generator().manual_seed(3)
    )
    no_baseline = cb_reinforce_from_samples(logits, total, rewards, lengths, "mbb", est.times)
    # The first batch saw c = 0: the same gradient as no baseline; then c is the batch mean.
    torch.testing.assert_close(
        torch.autograd.grad(est.loss.sum(), logits),
        torch.autograd.grad(no_baseline.loss.sum(), logits),
    )
    valid = est.times >= 0
    gathered = rewards.gather(1, est.times.clamp(min=0).permute(1, 0, 2)).permute(1, 0, 2)
    torch.testing.assert_close(baseline.mean, gathered[valid].mean().detach())


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_running_mean_and_learned_baselines_scale_by_the_labels_a_return_covers(estimator):
    # Both use c * n_s (n_s: labels in step s's return); with the same c they agree, and they
    # differ from an unscaled baseline c wherever some n_s != 1.
    logits, rewards, total, lengths = ragged_batch(22)
    times = cb_reinforce(
        logits, total, rewards, lengths, "bb", 3, generator=torch.Generator().manual_seed(4)
    ).times
    grads = []
    for baseline in (_running_mean_at(-1.7), torch.full((4,), -1.7, dtype=F64)):
        est = cb_reinforce_from_samples(logits, total, rewards, lengths, estimator, times, baseline)
        grads.append(torch.autograd.grad(est.loss.sum(), logits)[0])
    torch.testing.assert_close(grads[0], grads[1])
    none = cb_reinforce_from_samples(logits, total, rewards, lengths, estimator, times)
    (plain,) = torch.autograd.grad(none.loss.sum(), logits)
    assert (grads[0] - plain).abs().max() > 1e-3  # the baseline changes each sample's estimate


def test_learned_baseline_trains_on_its_squared_error():
    logits, rewards, total, lengths = ragged_batch(20)
    model = LearnedBaseline(num_features=2).double()
    with torch.no_grad():  # from a baseline of 0, not from the global RNG's draw: a random
        for p in model.parameters():  # start can begin below the estimator's noise floor
            p.zero_()
    features = torch.stack([torch.ones(len(total), dtype=F64), total / lengths], -1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    losses = []
    for step in range(30):
        est = cb_reinforce(
            logits,
            total,
            rewards,
            lengths,
            "bb",
            4,
            model(features),
            torch.Generator().manual_seed(step),
        )
        optimizer.zero_grad()
        est.control_variate_loss.sum().backward()
        losses.append(float(est.control_variate_loss.detach().sum()))
        optimizer.step()
    assert sum(losses[-5:]) < sum(losses[:5])


def test_bad_inputs_name_the_argument():
    logits, rewards, total, lengths = ragged_batch(21)

    def run(**kw):
        base = {"emit_logits": logits, "total": total, "rewards": rewards}
        base |= {"input_lengths": lengths, "estimator": "idb", "num_samples": 2}
        return cb_reinforce(**(base | kw))

    with pytest.raises(ValueError, match="estimator must be one of"):
        run(estimator="luo")
    with pytest.raises(ValueError, match="estimator='mbb'.*callable"):
        run(estimator="mbb", rewards=lambda times: torch.zeros(times.shape, dtype=F64))
    with pytest.raises(ValueError, match="num_samples"):
        run(num_samples=0)
    with pytest.raises(ValueError, match="loo.*num_samples >= 2"):
        run(num_samples=1, baseline="loo")
    with pytest.raises(ValueError, match=r"baseline.*shape \(B,\)"):
        run(baseline=torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match=r"total\[3\] = 4 > input_lengths\[3\] = 3"):
        run(total=torch.tensor([3, 2, 0, 4]))
    with pytest.raises(ValueError, match=r"rewards \(a callable\) must return"):
        run(rewards=lambda times: torch.zeros(times.shape[:-1], dtype=F64))
    with pytest.raises(ValueError, match=r"rewards \(callable output\)\[0, 1, 1\] = nan"):
        run(rewards=lambda times: _nan_at(times, (0, 1, 1)))
    with pytest.raises(ValueError, match="times must"):
        cb_reinforce_from_samples(
            logits, total, rewards, lengths, "idb", torch.zeros(1, 4, 3, dtype=torch.long)
        )


def _nan_at(times, index):
    out = torch.zeros(times.shape, dtype=F64)
    out[index] = float("nan")
    return out


CONSTANT = -1.7
CONSTANT_BASELINES = {  # every control variate, at what it would learn from a constant reward
    "loo": lambda B: "loo",
    "running": lambda B: _running_mean_at(CONSTANT),
    "learned": lambda B: torch.full((B,), CONSTANT, dtype=F64),
}


@pytest.mark.parametrize("baseline", list(CONSTANT_BASELINES))
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_constant_rewards_give_no_score_function_gradient(estimator, baseline):
    """With the same reward for every label, each sample's learning signal is exactly 0 (to
    rounding): the gradient w.r.t. the emission logits is that of log P(L) alone. The plain
    leave-one-out mean of the other samples' returns failed this for the ID-checking estimator,
    whose samples have different numbers of labels left at the same frame."""
    logits, _, total, lengths = ragged_batch(4)
    B, T = logits.shape
    rewards = torch.full((B, T, 3), CONSTANT, dtype=F64)
    est = cb_reinforce(
        logits,
        total,
        rewards,
        lengths,
        estimator,
        4,
        CONSTANT_BASELINES[baseline](B),
        torch.Generator().manual_seed(2),
    )
    (g,) = torch.autograd.grad(-est.loss.sum(), logits)
    (prior,) = torch.autograd.grad(PoissonBinomial(logits, lengths).log_prob(total).sum(), logits)
    torch.testing.assert_close(g, prior, rtol=0, atol=1e-13)
