"""Estimators on continuous relaxations of the CB (CB paper section 2.3, eqs. 36-37).

The CB relaxes through its decompositions (:mod:`cbasr.distributions.relaxations`): the
ID-checking steps (eq. 11) as Binary Concrete variables ``z_t`` (eq. 35), the Bounded
Bernoulli steps (eq. 13) as Concrete vectors ``z_l`` over frames (eq. 32), each conditioned on
the hard history.

- :func:`straight_through_cb`, eq. (37): ``log P(y | b) = sum_t b_t R[t, l_t]`` on the hard
  sample, differentiated as if ``d b_t = d z_t``. Biased.
- :func:`relax_cb`, eq. (36): REINFORCE on the ID-checking (eq. 23) or bounded (eq. 28) steps
  with a REBAR/RELAX control variate per step,
  ``(A_s - c(z~_s)) d log P(b_s | history) + d c(z_s) - d c(z~_s)``, where ``z_s`` is the
  relaxation whose threshold/argmax is the hard step and ``z~_s ~ p(z_s | b_s)``. Given the
  history each step is a single discrete choice, so the identity behind eq. (36) makes every
  step's term unbiased: the sum is an unbiased estimate of the gradient of eq. (19).

:class:`RebarControlVariate` is REBAR's ``c(z) = eta f(z)`` (Tucker et al., 2017): the
relaxed step's immediate reward, ``eta sum_e z_e v_e``, with learnable ``eta`` and temperature,
trained to minimise the estimator's variance through ``Estimate.control_variate_loss``.
"""

import math
from typing import NamedTuple

import torch
from torch import nn

from cbasr.distributions import (
    PoissonBinomial,
    bounded_bernoulli_conditional_noise,
    bounded_bernoulli_relaxed,
    concrete,
    concrete_bernoulli,
    id_checking_conditional_noise,
    id_checking_log_probs,
    id_checking_relaxed,
    sequence_to_times,
)
from cbasr.estimators._common import (
    Estimate,
    check_inputs,
    emitted_before,
    frame_rewards,
    label_mask,
    label_rewards,
    masked_logits,
    pad_times,
    reward_to_go,
    score_surrogate,
)
from cbasr.estimators.baselines import baseline_values

__all__ = ["RELAXATIONS", "RebarControlVariate", "straight_through_cb", "relax_cb"]

RELAXATIONS = ("id_checking", "bounded")


def _check_tensor_rewards(rewards, name: str) -> None:
    if not isinstance(rewards, torch.Tensor):
        raise ValueError(
            f"{name} needs memoryless rewards as a tensor (B, T, L): its relaxed steps are "
            "scored by the reward of every frame they could choose; got a callable"
        )


def _check_relaxation(relaxation: str, num_samples: int) -> None:
    if relaxation not in RELAXATIONS:
        raise ValueError(f"relaxation must be one of {RELAXATIONS}; got {relaxation!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1; got {num_samples}")


def _frame_label_rewards(rewards, samples, total, input_lengths) -> torch.Tensor:
    """``R[t, l_{t-1}]``: the reward frame ``t`` would earn by emitting the next label.

    ``(M, B, T)``; 0 where no label is left or on padding frames.
    """
    M, B, T = samples.shape
    L = rewards.shape[2]
    label = emitted_before(samples).long()  # (M, B, T)
    ok = (label < total[None, :, None]) & (
        torch.arange(T, device=samples.device) < input_lengths[:, None]
    )
    at = label.clamp(max=L - 1).unsqueeze(-1)  # (M, B, T, 1)
    gathered = rewards.unsqueeze(0).expand(M, -1, -1, -1).gather(3, at).squeeze(-1)
    return torch.where(ok, gathered, 0.0)


def straight_through_cb(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: torch.Tensor,
    input_lengths: torch.Tensor,
    relaxation: str = "id_checking",
    temperature: float | torch.Tensor = 1.0,
    num_samples: int = 1,
    generator: torch.Generator | None = None,
) -> Estimate:
    """Straight-through CB: ``log P(L) + sum_t b_t R[t, l_t]`` (eq. 37), ``d b = d z``.

    The forward value is the sampled objective; the backward pass replaces ``d b_t`` by the
    relaxation's ``d z_t`` (ID-checking) or ``d sum_l z_l[t]`` (bounded). ``l_t`` (which label
    frame ``t`` emits) comes from the hard sample. ``d log P(L)`` is exact. Biased.

    Args:
        emit_logits, total, input_lengths, num_samples, generator: as
            :func:`~cbasr.estimators.cb_reinforce`.
        rewards: ``(B, T, L)`` memoryless rewards (no callable).
        relaxation: ``"id_checking"`` (eqs. 11, 35) or ``"bounded"`` (eqs. 13, 32).
        temperature: ``lambda > 0`` (float or tensor).

    Returns:
        :class:`~cbasr.estimators.Estimate`.
    """
    L = check_inputs(emit_logits, total, rewards, input_lengths)
    _check_tensor_rewards(rewards, "straight_through_cb")
    _check_relaxation(relaxation, num_samples)
    emit_logits = masked_logits(emit_logits, input_lengths)
    total = total.to(emit_logits.device).long()
    relax = id_checking_relaxed if relaxation == "id_checking" else bounded_bernoulli_relaxed
    relaxed = relax(emit_logits, total, input_lengths, temperature, (num_samples,), generator)
    samples = relaxed.sample.detach()
    at_frames = _frame_label_rewards(rewards, samples, total, input_lengths)  # (M, B, T)
    # Straight-through likelihood, CB paper eq. (37).
    log_likelihood = (relaxed.straight_through * at_frames).sum(-1).mean(0)  # (B,)
    log_prior = PoissonBinomial(emit_logits, input_lengths).log_prob(total)
    objective = log_prior + log_likelihood
    times = sequence_to_times(samples, L)
    return Estimate(-objective, objective.detach(), samples, times)


class RebarControlVariate(nn.Module):
    """REBAR's control variate ``c(z) = eta sum_e z_e v_e`` with a learnable temperature.

    ``v_e`` is the immediate reward of outcome ``e`` of a step (a high at frame ``t``, or label
    ``l`` at each frame), so ``c`` is the step's reward evaluated at its relaxation.

    Args:
        eta: initial scale.
        temperature: initial ``lambda > 0`` of the relaxation.
        learn: train ``eta`` and ``lambda`` (through ``Estimate.control_variate_loss``).
    """

    def __init__(self, eta: float = 1.0, temperature: float = 0.5, learn: bool = True):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive; got {temperature}")
        self.eta = nn.Parameter(torch.tensor(float(eta)), requires_grad=learn)
        self.log_temperature = nn.Parameter(
            torch.tensor(math.log(temperature)), requires_grad=learn
        )

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def forward(self, relaxed: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``relaxed, values (..., E)`` -> ``(...)``: ``eta sum_e z_e v_e``."""
        return self.eta.to(relaxed.dtype) * (relaxed * values.detach()).sum(-1)


def relax_cb(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: torch.Tensor,
    input_lengths: torch.Tensor,
    control_variate: RebarControlVariate,
    relaxation: str = "id_checking",
    num_samples: int = 1,
    baseline=None,
    generator: torch.Generator | None = None,
) -> Estimate:
    """RELAX/REBAR estimate (eq. 36) of the gradient of eq. (19) on relaxed CB steps.

    ID-checking (eq. 23 as the REINFORCE part): step ``t`` has return ``sum_{t' >= t} R_t'``
    and ``c(z_t) = eta z_t R[t, l_{t-1}]``. Bounded (eq. 28): step ``l`` has return
    ``sum_{l' >= l} R_{t_l'}`` and ``c(z_l) = eta sum_t z_l[t] R[t, l]``. Forced steps are not
    relaxed (their score is 0, as the paper notes after eq. 36).

    ``control_variate_loss`` is ``sum_t g_t^2`` for the estimate ``g (B, T)`` of the gradient
    w.r.t. ``emit_logits`` (a variance surrogate: its mean does not depend on the control
    variate); differentiate it w.r.t. the control variate's parameters only, e.g.
    ``torch.autograd.grad(loss.sum(), control_variate.parameters())``. It is None when the
    control variate has nothing to learn or ``emit_logits`` needs no gradient. A learned
    baseline's squared error is added to it (it only reaches the baseline's parameters).

    Args:
        emit_logits, total, input_lengths, num_samples, generator: as
            :func:`~cbasr.estimators.cb_reinforce`.
        rewards: ``(B, T, L)`` memoryless rewards (no callable).
        control_variate: a :class:`RebarControlVariate` (its temperature is the relaxation's).
        relaxation: ``"id_checking"`` or ``"bounded"``.
        baseline: as :func:`~cbasr.estimators.cb_reinforce`, subtracted from the returns too
            (the control variate only tracks the step's immediate reward).

    Returns:
        :class:`~cbasr.estimators.Estimate`.
    """
    L = check_inputs(emit_logits, total, rewards, input_lengths)
    _check_tensor_rewards(rewards, "relax_cb")
    _check_relaxation(relaxation, num_samples)
    logits = masked_logits(emit_logits, input_lengths)
    total = total.to(emit_logits.device).long()
    temperature = control_variate.temperature.to(emit_logits.dtype)
    relax = _id_checking_steps if relaxation == "id_checking" else _bounded_steps
    parts = relax(logits, total, rewards, input_lengths, temperature, num_samples, L, generator)
    samples, times, steps, returns, covered, valid = parts[:6]
    cv = control_variate(parts.relaxed, parts.values)
    cv_conditional = control_variate(parts.conditional, parts.values)
    cv = torch.where(valid, cv, 0.0)
    cv_conditional = torch.where(valid, cv_conditional, 0.0)
    label_valid = label_mask(total, L).expand(num_samples, len(total), L)
    fixed = label_rewards(rewards, times, total).detach()
    base, baseline_loss = baseline_values(baseline, returns, covered, fixed, label_valid)
    # RELAX / REBAR, CB paper eq. (36), one discrete step at a time.
    coefficients = returns - base - cv_conditional  # (M, B, S); detached in the surrogate
    score = score_surrogate(steps, coefficients, valid)
    correction = (cv - cv_conditional).sum(-1).mean(0)  # (B,)
    log_prior = PoissonBinomial(logits, input_lengths).log_prob(total)
    pathwise = label_rewards(rewards, times, total).sum(-1).mean(0)
    value = (log_prior + pathwise).detach()
    loss = -(log_prior + pathwise + score + correction)
    variance_loss = _variance_surrogate(
        emit_logits, control_variate, log_prior, steps, coefficients, valid, correction
    )
    if baseline_loss is not None:  # a learned baseline trains on its own squared error
        variance_loss = baseline_loss if variance_loss is None else variance_loss + baseline_loss
    return Estimate(loss, value, samples, times, variance_loss)


class _RelaxedSteps(NamedTuple):
    """The discrete steps of one relaxation and what RELAX needs of them (``S`` steps of
    ``E`` outcomes each).

    Attributes:
        samples: ``(M, B, T)``; times: ``(M, B, L)``.
        steps: ``(M, B, S)`` log probabilities of the sampled steps given the history.
        returns: ``(M, B, S)`` their reward-to-go; covered: labels in each return.
        valid: ``(M, B, S)`` the steps that exist.
        relaxed: ``(M, B, S, E)`` ``z``; conditional: ``(M, B, S, E)`` ``z~ | b``.
        values: ``(..., S, E)`` the immediate reward of each outcome.
    """

    samples: torch.Tensor
    times: torch.Tensor
    steps: torch.Tensor
    returns: torch.Tensor
    covered: torch.Tensor
    valid: torch.Tensor
    relaxed: torch.Tensor
    conditional: torch.Tensor
    values: torch.Tensor


def _id_checking_steps(logits, total, rewards, lengths, temperature, M, L, generator):
    """ID-checking steps (eqs. 11, 23, 35): one Bernoulli per frame, ``E = 1`` (a high)."""
    T = logits.shape[1]
    r = id_checking_relaxed(logits, total, lengths, temperature, (M,), generator)
    samples = r.sample.detach()
    times = sequence_to_times(samples, L)
    noise = id_checking_conditional_noise(r.log_odds, samples, generator)
    conditional = concrete_bernoulli(r.log_odds, noise, temperature)  # z~ | b
    values = _frame_label_rewards(rewards, samples, total, lengths).unsqueeze(-1)
    steps = id_checking_log_probs(logits, total, samples, lengths)  # (M, B, T)
    per_label = label_rewards(rewards, times, total).detach()
    returns = reward_to_go(frame_rewards(per_label, times, T))
    covered = total[None, :, None] - emitted_before(samples).long()
    valid = (torch.arange(T, device=logits.device) < lengths[:, None]).expand_as(samples)
    relaxed = (r.relaxed.unsqueeze(-1), conditional.unsqueeze(-1))
    return _RelaxedSteps(samples, times, steps, returns, covered, valid, *relaxed, values)


def _bounded_steps(logits, total, rewards, lengths, temperature, M, L, generator):
    """Bounded Bernoulli steps (eqs. 13, 28, 32): one categorical over frames per label."""
    T = logits.shape[1]
    r = bounded_bernoulli_relaxed(logits, total, lengths, temperature, (M,), generator)
    times = pad_times(r.times, L)
    noise = bounded_bernoulli_conditional_noise(r.step_log_probs, r.times, generator)
    conditional = concrete(r.step_log_probs, noise, temperature)  # (M, B, K, T)
    K = r.times.shape[-1]
    labels_ok = label_mask(total, K)  # (B, K)
    frames_ok = torch.arange(T, device=logits.device) < lengths[:, None]  # (B, T)
    ok = frames_ok[:, :, None] & labels_ok[:, None, :]  # (B, T, K)
    values = torch.where(ok, rewards[..., :K], 0.0).transpose(1, 2)  # (B, T, K) -> (B, K, T)
    at = r.times.clamp(min=0).unsqueeze(-1)  # (M, B, K, 1)
    steps = r.step_log_probs.gather(-1, at).squeeze(-1)  # (M, B, K)
    returns = reward_to_go(label_rewards(rewards, times, total)[..., :K].detach())
    covered = total[None, :, None] - torch.arange(K, device=logits.device)
    valid = labels_ok.expand(M, -1, -1)
    samples = r.sample.detach()
    return _RelaxedSteps(
        samples, times, steps, returns, covered, valid, r.relaxed, conditional, values
    )


def _variance_surrogate(
    emit_logits, control_variate, log_prior, steps, coefficients, valid, correction
):
    """``sum_t g_t^2`` with ``g`` the estimate's gradient w.r.t. the logits, as a function of
    the control variate (RELAX's variance objective). None when there is nothing to train."""
    learn = any(p.requires_grad for p in control_variate.parameters())
    if not (learn and emit_logits.requires_grad and torch.is_grad_enabled()):
        return None
    M = steps.shape[0]
    steps = torch.where(valid, steps, 0.0)
    weights = torch.where(valid, coefficients, 0.0) / M  # keeps its graph to eta and lambda
    (score,) = torch.autograd.grad(
        steps, emit_logits, weights, create_graph=True, allow_unused=True
    )
    (rest,) = torch.autograd.grad(
        (log_prior + correction).sum(), emit_logits, create_graph=True, allow_unused=True
    )
    gradient = sum(g for g in (score, rest) if g is not None)
    return (gradient**2).sum(-1)  # (B, T) -> (B,)
