"""The exact REINFORCE objective for memoryless rewards (CB paper eqs. 19 and 15).

Section 2.2 bounds ``log P(y)`` by ``R = log P(L) + E_{b|L}[log P(y | b)]`` (Jensen, before
eq. 19). With memoryless rewards ``R_{t_l} = log P(y_l | t_l, y_<l)`` the expectation splits
over labels, and each term needs only the marginal of the ``l``-th emission time, the
Bounded Bernoulli marginal of eq. (15):

    E_{b|L}[sum_l R_{t_l}] = sum_l sum_t P(t_l = t | L) R[t, l].

This is what the sampling estimators (eqs. 21, 23, 28, 29) estimate the gradient of, so it is
their oracle. It differs from the exact marginal ``log P(y)`` of eq. (38)
(:func:`cbasr.losses.cb_marginal_nll`) by the Jensen gap.
"""

import torch

from cbasr.distributions import PoissonBinomial, bounded_bernoulli_marginals
from cbasr.estimators._common import check_inputs, masked_logits, reward_mask

__all__ = ["cb_expected_reward"]


def cb_expected_reward(
    emit_logits: torch.Tensor,
    total: torch.Tensor,
    rewards: torch.Tensor,
    input_lengths: torch.Tensor,
) -> torch.Tensor:
    """``log P(L) + E_{b|L}[sum_l R[t_l, l]]`` exactly, through the marginals of eq. (15).

    ``P(L)`` is the Poisson-Binomial (eq. 5) of the emission Bernoullis
    ``P(B_t = 1) = sigmoid(emit_logits[t])``. O(B T L) work and memory.

    Args:
        emit_logits: ``(B, T)`` emission log odds.
        total: ``(B,)`` int64 number of labels ``L_b <= input_lengths[b]``.
        rewards: ``(B, T, L)`` memoryless rewards ``R[b, t, l] = log P(y_l | t_l = t, y_<l)``
            with ``L >= max(total)``; entries at ``t >= input_lengths`` or ``l >= total`` are
            ignored (they may hold anything).
        input_lengths: ``(B,)`` int64 number of frames.

    Returns:
        ``(B,)``, differentiable (twice) w.r.t. ``emit_logits`` and ``rewards``.
    """
    L = check_inputs(emit_logits, total, rewards, input_lengths)
    T = emit_logits.shape[1]
    emit_logits = masked_logits(emit_logits, input_lengths)
    total = total.to(emit_logits.device).long()
    log_prior = PoissonBinomial(emit_logits, input_lengths).log_prob(total)  # (B,)
    marginals = bounded_bernoulli_marginals(emit_logits, total, input_lengths)  # (B, K, T)
    K = marginals.shape[1]
    # Padded entries are replaced before the product so that NaN or inf there cannot leak.
    valid = reward_mask(input_lengths, total, T, L)
    masked = torch.where(valid, rewards, 0.0)[..., :K]  # (B, T, K)
    # Expected reward under the Bounded Bernoulli marginals, CB paper eq. (15).
    expected = (marginals * masked.transpose(1, 2)).sum((1, 2))  # (B, T, K) -> (B, K, T)
    return log_prior + expected
