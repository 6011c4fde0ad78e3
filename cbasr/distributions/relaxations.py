"""Continuous relaxations of the Conditional Bernoulli via its decompositions (CB paper section 2.3).

The CB itself has no Concrete relaxation: as a categorical over the C(T, k) sets, its Gumbel
noise does not factor over frames. Its decompositions do relax:

- ID-checking (eq. 11): each step is a Bernoulli with log odds ``l_t`` given the hard prefix
  ``b_<t``; eq. (35) relaxes it to ``z_t = sigmoid((l_t + D_t) / lambda)`` and
  ``b_t = H(z_t) = [z_t > 1/2]``.
- Bounded Bernoulli (eq. 13): each step is a categorical over frames given the previous high;
  eq. (32) relaxes it to ``z_l = softmax((l_l + G_l) / lambda)``, ``t_l = argmax`` (eq. 33).
- BB marginals (eq. 15): one categorical per label,
  ``concrete(bounded_bernoulli_marginals(..., log=True), gumbel_noise(...), lambda)``.

The hard values are exact CB samples (the noise is shared with the samplers), and each step's
logits are conditioned on the hard history, as REBAR and RELAX (eq. 36) need. The
``straight_through`` output is the hard sample in the forward pass with the relaxation's
gradient in the backward pass (section 2.3, before eq. 37). For eq. (36)'s ``z | b``, the
``*_conditional_noise`` functions draw noise conditioned on the hard sample (REBAR's
``z~``), differentiably in the step logits.
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from cbasr.distributions._arguments import largest_total
from cbasr.distributions._tables import log_sum_exp, suffix_at
from cbasr.distributions.samplers import (
    _bounded_loop,
    _bounded_rows,
    _bounded_step_log_probs,
    _id_checking_log_odds,
    _id_checking_loop,
    _prepare_sampling,
    _uniform_noise,
    logistic_noise,
)

__all__ = [
    "concrete",
    "concrete_bernoulli",
    "IdCheckingRelaxation",
    "id_checking_relaxed",
    "id_checking_conditional_noise",
    "BoundedRelaxation",
    "bounded_bernoulli_relaxed",
    "bounded_bernoulli_conditional_noise",
]

_NEG_INF = float("-inf")


def _check_temperature(temperature) -> None:
    """A number must be positive (a tensor is not checked: that would synchronise a GPU)."""
    if not torch.is_tensor(temperature) and not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")


def concrete_bernoulli(log_odds: torch.Tensor, noise: torch.Tensor, temperature) -> torch.Tensor:
    """Binary Concrete, eq. (35): ``sigmoid((log_odds + D) / temperature)``.

    ``+-inf`` log odds (forced steps) give exactly 1 / 0 with zero gradient, also w.r.t. a
    learnable temperature.
    """
    forced = torch.isinf(log_odds)
    scaled = (torch.where(forced, 0.0, log_odds) + noise) / temperature
    return torch.where(forced, (log_odds > 0).to(scaled.dtype), torch.sigmoid(scaled))


def concrete(log_weights: torch.Tensor, noise: torch.Tensor, temperature) -> torch.Tensor:
    """Concrete / Gumbel-softmax over the last dimension, eq. (32).

    ``softmax((log w + G) / temperature)``; ``-inf`` weights get exactly 0 and a row without a
    finite weight gives zeros (a step that does not exist).
    """
    finite = torch.isfinite(log_weights)
    scaled = (torch.where(finite, log_weights, 0.0) + noise) / temperature
    scaled = torch.where(finite, scaled, _NEG_INF)
    any_finite = finite.any(-1, keepdim=True)
    relaxed = torch.softmax(torch.where(any_finite, scaled, 0.0), -1)
    return torch.where(any_finite, relaxed, 0.0)


class IdCheckingRelaxation(NamedTuple):
    """Relaxed ID-checking sample; every field is ``(*sample_shape, *, T)``.

    Attributes:
        sample: 0./1. exact CB sample, ``[log_odds + noise > 0]``: eq. (35)'s hard map
            ``H(relaxed) = [relaxed > 1/2]``.
        log_odds: step log odds (eq. 11) given the hard prefix; ``+inf`` / ``-inf`` on forced
            steps, ``-inf`` on padding. Differentiable w.r.t. the logits.
        noise: the logistic noise ``D`` (eq. 35).
        relaxed: ``z = sigmoid((log_odds + noise) / temperature)``.
        straight_through: ``sample`` forward, ``d relaxed`` backward.
    """

    sample: torch.Tensor
    log_odds: torch.Tensor
    noise: torch.Tensor
    relaxed: torch.Tensor
    straight_through: torch.Tensor


def _id_checking_step_log_odds(tables, row_index, high: torch.Tensor) -> torch.Tensor:
    """Log odds of every ID-checking step (eq. 11) along a given ``high (N, T)`` sequence."""
    T = high.shape[-1]
    before = tables.total[row_index].unsqueeze(-1) - (high.long().cumsum(-1) - high.long())
    frames = torch.arange(1, T + 1, device=high.device)
    rows = row_index.unsqueeze(-1)  # (N,) -> (N, 1)
    return _id_checking_log_odds(
        tables.log_on[row_index],
        tables.log_off[row_index],
        suffix_at(tables.suffix, rows, frames, before - 1),
        suffix_at(tables.suffix, rows, frames, before),
    )


def id_checking_relaxed(
    logits, total, lengths=None, temperature=1.0, sample_shape=torch.Size(), generator=None
) -> IdCheckingRelaxation:
    """Draw an ID-checking CB sample together with its Binary Concrete relaxation (eqs. 11, 35).

    Args:
        logits: ``(*, T)`` log odds; total: ``(*,)`` highs; lengths: ``(*,)`` frames.
        temperature: ``lambda > 0`` (float or tensor, may require grad).
        sample_shape: leading sample dimensions.
        generator: source of randomness.

    Returns:
        :class:`IdCheckingRelaxation`. Serial depth T (sampling), then vectorised.
    """
    _check_temperature(temperature)
    sample_shape = torch.Size(sample_shape)
    args, tables, row_index = _prepare_sampling(logits, total, lengths, sample_shape)
    T = args.logits.shape[-1]
    noise = logistic_noise((len(row_index), T), generator, args.logits.dtype, args.logits.device)
    with torch.no_grad():
        high = _id_checking_loop(tables, row_index, noise)
    log_odds = _id_checking_step_log_odds(tables, row_index, high)
    relaxed = concrete_bernoulli(log_odds, noise, temperature)
    sample = high.to(relaxed.dtype)
    straight_through = sample + (relaxed - relaxed.detach())
    shape = sample_shape + args.batch_shape + (T,)
    fields = (sample, log_odds, noise, relaxed, straight_through)
    return IdCheckingRelaxation(*(x.reshape(shape) for x in fields))


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate at both ends, NaN-free gradients."""
    near_zero = x > -math.log(2.0)
    a = torch.log(-torch.expm1(torch.where(near_zero, x, -1.0)))
    b = torch.log1p(-torch.exp(torch.where(near_zero, -1.0, x)))
    return torch.where(near_zero, a, b)


def id_checking_conditional_noise(
    log_odds: torch.Tensor, sample: torch.Tensor, generator=None
) -> torch.Tensor:
    """Logistic noise conditioned on the hard sample: ``D~ ~ p(D | [log_odds + D > 0] = b)``.

    REBAR's ``z~ | b`` for the Bernoulli steps: with ``U = sigmoid(D)``, ``b = 1`` means
    ``U ~ Uniform(1 - p, 1)`` and ``b = 0`` means ``U ~ Uniform(0, 1 - p)``. Reparameterised
    by a fresh uniform, so ``concrete_bernoulli(log_odds, D~, lambda)`` is differentiable in
    ``log_odds``. ``H(log_odds + D~) = b`` up to floating-point rounding at the boundary.

    Args:
        log_odds: ``(*, T)`` step log odds (e.g. ``IdCheckingRelaxation.log_odds``).
        sample: ``(*, T)`` the hard 0./1. sample.

    Returns:
        ``(*, T)`` noise; finite.
    """
    v = _uniform_noise(log_odds.shape, generator, log_odds.dtype, log_odds.device)
    log_p, log_q = F.logsigmoid(log_odds), F.logsigmoid(-log_odds)
    # b = 1: U = (1 - p) + p v, so 1 - U = p (1 - v).
    log_rest_high = log_p + torch.log1p(-v)
    noise_high = _log1mexp(log_rest_high) - log_rest_high
    # b = 0: U = (1 - p) v.
    log_u_low = log_q + torch.log(v)
    noise_low = log_u_low - _log1mexp(log_u_low)
    return torch.where(sample != 0, noise_high, noise_low)


class BoundedRelaxation(NamedTuple):
    """Relaxed Bounded Bernoulli sample; ``K = max(total)``.

    Attributes:
        times: ``(*S, *, K)`` int64 emission frames, -1 for ``l >= total``.
        sample: ``(*S, *, T)`` 0./1. exact CB sample (the highs at ``times``).
        step_log_probs: ``(*S, *, K, T)`` ``log P(t_l = t | t_{l-1}, k - l)`` (eq. 13) given
            the hard previous high; ``-inf`` for excluded frames and for rows ``l >= total``.
        noise: ``(*S, *, K, T)`` Gumbel noise; ``times = argmax(step_log_probs + noise)``.
        relaxed: ``(*S, *, K, T)`` Concrete ``z_l`` (eq. 32); zero rows for ``l >= total``.
        straight_through: ``(*S, *, T)`` ``sample`` forward, ``d sum_l relaxed_l`` backward.
    """

    times: torch.Tensor
    sample: torch.Tensor
    step_log_probs: torch.Tensor
    noise: torch.Tensor
    relaxed: torch.Tensor
    straight_through: torch.Tensor


def bounded_bernoulli_relaxed(
    logits, total, lengths=None, temperature=1.0, sample_shape=torch.Size(), generator=None
) -> BoundedRelaxation:
    """Draw a Bounded Bernoulli CB sample with its per-step Concrete relaxation (eqs. 13, 32).

    Args: as :func:`id_checking_relaxed`.

    Returns:
        :class:`BoundedRelaxation`. Serial depth K (sampling), then vectorised: O(N K T) memory.
    """
    _check_temperature(temperature)
    sample_shape = torch.Size(sample_shape)
    args, tables, row_index = _prepare_sampling(logits, total, lengths, sample_shape)
    T, N = args.logits.shape[-1], len(row_index)
    K = largest_total(args)
    rows = _bounded_rows(tables, row_index)
    with torch.no_grad():
        times, noise = _bounded_loop(tables, rows, K, generator, keep_noise=True)
    if noise is None:  # K == 0
        noise = args.logits.new_zeros(N, 0, T)
    total_n = tables.total[row_index].unsqueeze(-1)  # (N, 1)
    order = torch.arange(K, device=times.device)
    prev = F.pad(times[:, :-1], (1, 0), value=-1)  # t_{l-1}, -1 before the first
    remaining = (total_n - 1 - order).clamp(min=0)
    step = _bounded_step_log_probs(tables, rows, prev, remaining)  # (N, K, T)
    step = torch.where((order < total_n).unsqueeze(-1), step, _NEG_INF)
    relaxed = concrete(step, noise, temperature)
    hit = torch.where(times >= 0, times, T)  # -1 -> dummy frame T
    sample = step.new_zeros(N, T + 1).scatter(1, hit, 1.0)[:, :T]
    straight_through = sample + (relaxed - relaxed.detach()).sum(1)
    lead = sample_shape + args.batch_shape
    return BoundedRelaxation(
        times.reshape(lead + (K,)),
        sample.reshape(lead + (T,)),
        step.reshape(lead + (K, T)),
        noise.reshape(lead + (K, T)),
        relaxed.reshape(lead + (K, T)),
        straight_through.reshape(lead + (T,)),
    )


def bounded_bernoulli_conditional_noise(
    step_log_probs: torch.Tensor, times: torch.Tensor, generator=None
) -> torch.Tensor:
    """Gumbel noise conditioned on the argmax: ``G~ ~ p(G | argmax(l + G) = t_l)`` per step.

    REBAR's ``z~ | b`` for categorical steps (Tucker et al., 2017): with ``E = log(-log V)``,
    the chosen frame gets ``l + G~ = -E_t`` and every other frame
    ``l_i + G~_i = -log(exp(E_i - l_i) + exp(E_t))``, which is below it. ``l`` is normalised
    first. Differentiable in ``step_log_probs``; rows with ``times < 0`` get plain Gumbel noise.

    Args:
        step_log_probs: ``(*, K, T)`` (e.g. ``BoundedRelaxation.step_log_probs``).
        times: ``(*, K)`` chosen frames, -1 for steps that do not exist.

    Returns:
        ``(*, K, T)`` finite noise.
    """
    log_probs = step_log_probs - log_sum_exp(step_log_probs, -1).unsqueeze(-1).nan_to_num(
        neginf=0.0
    )
    v = _uniform_noise(log_probs.shape, generator, log_probs.dtype, log_probs.device)
    e = torch.log(-torch.log(v))
    chosen = times.clamp(min=0).unsqueeze(-1)  # (*, K, 1)
    e_chosen = e.gather(-1, chosen)
    top = -e_chosen - log_probs.gather(-1, chosen)
    others = -torch.logaddexp(e, e_chosen + log_probs)
    frames = torch.arange(log_probs.shape[-1], device=log_probs.device)
    noise = torch.where(frames == chosen, top.expand_as(others), others)
    return torch.where((times >= 0).unsqueeze(-1), noise, -e)
