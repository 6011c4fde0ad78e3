"""Concrete relaxations of the ID-checking and bounded steps (CB paper section 2.3)."""

import math

import pytest
import torch

from cbasr.distributions import (
    bounded_bernoulli_conditional_noise,
    bounded_bernoulli_log_probs,
    bounded_bernoulli_relaxed,
    concrete,
    concrete_bernoulli,
    id_checking_conditional_noise,
    id_checking_log_probs,
    id_checking_relaxed,
)
from tests.distributions.cases import chi_square_p_value, extreme_logits, random_logits
from tests.reference import cb_enumeration as ref


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


def test_id_checking_hard_sample_is_the_relaxation_thresholded():
    logits = random_logits(3, 8, seed=130)
    totals, lengths = torch.tensor([3, 0, 5]), torch.tensor([8, 6, 5])
    relaxation = id_checking_relaxed(logits, totals, lengths, 0.5, (20,), _seeded(0))
    assert relaxation.sample.shape == (20, 3, 8)
    # eq. (35)'s H: the hard sample is the relaxation thresholded.
    assert torch.equal(relaxation.sample.bool(), relaxation.log_odds + relaxation.noise > 0)
    assert torch.equal(relaxation.sample.bool(), relaxation.relaxed > 0.5)
    assert torch.equal(relaxation.sample.sum(-1), totals.double().expand(20, 3))
    # The step log odds are those of eq. (11) along the hard sample.
    steps = id_checking_log_probs(logits, totals, relaxation.sample, lengths)
    chosen = torch.where(relaxation.sample.bool(), relaxation.log_odds, -relaxation.log_odds)
    torch.testing.assert_close(torch.nn.functional.logsigmoid(chosen), steps)


def test_bounded_hard_sample_is_the_argmax_of_the_relaxation():
    logits = random_logits(3, 8, seed=131)
    totals, lengths = torch.tensor([3, 0, 5]), torch.tensor([8, 6, 5])
    relaxation = bounded_bernoulli_relaxed(logits, totals, lengths, 0.5, (20,), _seeded(1))
    K = 5
    assert relaxation.step_log_probs.shape == (20, 3, K, 8) and relaxation.times.shape == (20, 3, K)
    active = relaxation.times >= 0
    argmax = (relaxation.step_log_probs + relaxation.noise).argmax(-1)  # eq. (33)
    assert torch.equal(argmax[active], relaxation.times[active])
    assert torch.equal(active.sum(-1), totals.expand(20, 3))
    # Rows l >= total are empty; the others are distributions (eq. 13) and Concrete points.
    assert (relaxation.relaxed[~active] == 0).all()
    ones = torch.ones(int(active.sum()), dtype=torch.float64)
    torch.testing.assert_close(relaxation.relaxed[active].sum(-1), ones)
    torch.testing.assert_close(relaxation.step_log_probs[active].exp().sum(-1), ones)
    steps = bounded_bernoulli_log_probs(logits, totals, relaxation.times, lengths)
    chosen = relaxation.times.clamp(min=0).unsqueeze(-1)
    at_times = relaxation.step_log_probs.gather(-1, chosen).squeeze(-1)
    torch.testing.assert_close(at_times[active], steps[active])


@pytest.mark.parametrize("relax", [id_checking_relaxed, bounded_bernoulli_relaxed])
def test_relaxed_samples_follow_the_cb(relax):
    logits = random_logits(5, seed=132)
    support, log_probs = ref.cb_log_probs(logits, 2, 5)
    samples = relax(logits, 2, None, 1.0, (4000,), _seeded(2)).sample
    counts = (
        (samples.unsqueeze(1) == torch.tensor(support, dtype=samples.dtype)).all(-1).sum(0).double()
    )
    assert chi_square_p_value(counts, log_probs.exp()) > 1e-3


@pytest.mark.parametrize("relax", [id_checking_relaxed, bounded_bernoulli_relaxed])
def test_straight_through_is_the_sample_forward_and_the_relaxation_backward(relax):
    logits = random_logits(2, 7, seed=133).requires_grad_()
    totals = torch.tensor([3, 2])
    relaxation = relax(logits, totals, None, 0.7, (4,), _seeded(3))
    assert torch.equal(relaxation.straight_through, relaxation.sample)
    weights = random_logits(4, 2, 7, seed=134)
    straight_through = (relaxation.straight_through * weights).sum()
    (grad_st,) = torch.autograd.grad(straight_through, logits, retain_graph=True)
    relaxed = relaxation.relaxed if relaxation.relaxed.dim() == 3 else relaxation.relaxed.sum(-2)
    (grad_relaxed,) = torch.autograd.grad((relaxed * weights).sum(), logits)
    torch.testing.assert_close(grad_st, grad_relaxed)
    assert grad_st.abs().sum() > 0


@pytest.mark.parametrize("relax", [id_checking_relaxed, bounded_bernoulli_relaxed])
def test_low_temperature_approaches_the_hard_sample(relax):
    # Eq. (34): with the same noise, z moves towards H(z) as the temperature falls.
    logits = random_logits(2, 7, seed=135)
    errors = []
    for temperature in (1.0, 1e-2, 1e-4):
        relaxation = relax(logits, torch.tensor([3, 2]), None, temperature, (50,), _seeded(4))
        relaxed = (
            relaxation.relaxed if relaxation.relaxed.dim() == 3 else relaxation.relaxed.sum(-2)
        )
        errors.append((relaxed - relaxation.sample).abs())
    assert errors[0].mean() > errors[1].mean() > errors[2].mean()
    assert errors[2].mean() < 1e-3


@pytest.mark.parametrize("relax", [id_checking_relaxed, bounded_bernoulli_relaxed])
def test_relaxation_gradcheck_with_fixed_noise(relax):
    # With the same seed the noise and hard sample are fixed; z is smooth in the logits.
    logits = random_logits(2, 5, seed=136).requires_grad_()
    temperature = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)

    def f(x, lam):
        return relax(x, torch.tensor([2, 3]), torch.tensor([5, 4]), lam, (3,), _seeded(5)).relaxed

    assert torch.autograd.gradcheck(f, (logits, temperature))


@pytest.mark.parametrize("relax", [id_checking_relaxed, bounded_bernoulli_relaxed])
def test_extreme_logits_give_finite_gradients(relax):
    logits = extreme_logits(2, 300, seed=7).requires_grad_()
    temperature = torch.tensor(0.5, requires_grad=True)
    totals, lengths = torch.tensor([90, 0]), torch.tensor([300, 200])
    relaxation = relax(logits, totals, lengths, temperature, (2,), _seeded(6))
    weights = torch.linspace(-1, 1, 300)
    relaxed = relaxation.relaxed if relaxation.relaxed.dim() == 3 else relaxation.relaxed.sum(-2)
    ((relaxed + relaxation.straight_through) * weights).sum().backward()
    assert torch.isfinite(logits.grad).all() and torch.isfinite(temperature.grad)


def test_temperature_must_be_positive():
    for relax in (id_checking_relaxed, bounded_bernoulli_relaxed):
        with pytest.raises(ValueError, match="temperature"):
            relax(random_logits(4, seed=138), 2, temperature=0.0)


def test_concrete_functions_handle_impossible_entries():
    noise = torch.zeros(3)
    z = concrete_bernoulli(torch.tensor([math.inf, -math.inf, 0.0]), noise, 0.5)
    assert torch.equal(z, torch.tensor([1.0, 0.0, 0.5]))
    rows = torch.tensor([[0.0, -math.inf, math.log(3.0)], [-math.inf, -math.inf, -math.inf]])
    z = concrete(rows, torch.zeros(2, 3), 1.0)
    torch.testing.assert_close(z, torch.tensor([[0.25, 0.0, 0.75], [0.0, 0.0, 0.0]]))


def test_id_checking_conditional_noise_is_consistent_and_logistic():
    # b ~ Bernoulli(sigmoid(l)) and then D~ | b must be Logistic(0, 1) overall (REBAR's z~).
    n = 20000
    log_odds = torch.tensor([-2.0, 0.0, 1.5, math.inf, -math.inf], dtype=torch.float64).expand(n, 5)
    generator = _seeded(7)
    uniform = torch.rand(n, 5, generator=generator, dtype=torch.float64)
    sample = (uniform < torch.sigmoid(log_odds)).double()
    noise = id_checking_conditional_noise(log_odds, sample, generator)
    assert torch.isfinite(noise).all()
    assert torch.equal(sample.bool(), log_odds + noise > 0)
    uniform = torch.sigmoid(noise).sort(0).values  # should be Uniform(0, 1) in every column
    ks = (
        (uniform - torch.arange(1, n + 1, dtype=torch.float64).unsqueeze(-1) / n)
        .abs()
        .max(0)
        .values
    )
    assert (ks < 1.63 / math.sqrt(n)).all()  # Kolmogorov-Smirnov at the 1% level


def test_bounded_conditional_noise_is_consistent_and_gumbel():
    # t ~ Categorical(softmax(l)) and then G~ | t must be i.i.d. Gumbel(0, 1) overall.
    n = 20000
    log_probs = torch.log_softmax(
        torch.tensor([0.3, -1.0, 2.0, -math.inf], dtype=torch.float64), -1
    )
    log_probs = log_probs.expand(n, 1, 4)
    generator = _seeded(8)
    times = torch.multinomial(log_probs[:, 0].exp(), 1, generator=generator)  # (n, 1)
    noise = bounded_bernoulli_conditional_noise(log_probs, times, generator)
    assert torch.isfinite(noise).all()
    finite = torch.isfinite(log_probs[0, 0])
    assert torch.equal((log_probs + noise)[..., finite].argmax(-1), times)
    uniform = torch.exp(-torch.exp(-noise[:, 0])).sort(0).values  # Gumbel CDF
    ks = (
        (uniform - torch.arange(1, n + 1, dtype=torch.float64).unsqueeze(-1) / n)
        .abs()
        .max(0)
        .values
    )
    assert (ks < 1.63 / math.sqrt(n)).all()


def test_conditional_noise_is_differentiable():
    logits = random_logits(2, 6, seed=137).requires_grad_()
    relaxation = id_checking_relaxed(logits, torch.tensor([2, 6]), None, 0.5, (), _seeded(9))
    noise = id_checking_conditional_noise(relaxation.log_odds, relaxation.sample, _seeded(10))
    z = concrete_bernoulli(relaxation.log_odds, noise, 0.5)
    bounded = bounded_bernoulli_relaxed(logits, torch.tensor([2, 6]), None, 0.5, (), _seeded(11))
    gumbel = bounded_bernoulli_conditional_noise(bounded.step_log_probs, bounded.times, _seeded(12))
    z_bounded = concrete(bounded.step_log_probs, gumbel, 0.5)
    (z.sum() + (z_bounded * torch.arange(6.0, dtype=torch.float64)).sum()).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
