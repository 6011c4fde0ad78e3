"""cb_expected_reward: the exact objective of CB paper eq. (19), through the marginals of
eq. (15)."""

import math

import pytest
import torch

from cbasr.estimators import cb_expected_reward
from cbasr.losses import cb_marginal_nll
from tests.estimators.cases import F64, LENGTHS, ragged_batch
from tests.reference import estimator_enumeration as ref


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_enumeration_values_and_gradients(seed, device):
    logits, rewards, total, lengths = ragged_batch(seed, device=device)
    value = cb_expected_reward(logits, total, rewards, lengths)
    g_logits, g_rewards = torch.autograd.grad(value.sum(), (logits, rewards))
    for b, (tb, lb) in enumerate(LENGTHS):
        x = logits[b].detach().cpu().clone().requires_grad_()
        r = rewards[b].detach().cpu().clone().requires_grad_()
        want = ref.expected_reward(x, lb, tb, r)
        want_x, want_r = torch.autograd.grad(want, (x, r), allow_unused=True)
        want_r = torch.zeros_like(r) if want_r is None else want_r
        torch.testing.assert_close(value[b].cpu(), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_logits[b].cpu(), want_x, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g_rewards[b].cpu(), want_r, rtol=1e-10, atol=1e-12)


def test_gradcheck():
    logits, rewards, total, lengths = ragged_batch(2)
    assert torch.autograd.gradcheck(
        lambda a, r: cb_expected_reward(a, total, r, lengths), (logits, rewards)
    )
    assert torch.autograd.gradgradcheck(
        lambda a, r: cb_expected_reward(a, total, r, lengths), (logits, rewards)
    )


def test_hand_worked_value():
    # T = 2, L = 1: P(L) = p1 q2 + q1 p2; E[R] = (p1 q2 R[0] + q1 p2 R[1]) / P(L).
    logits = torch.tensor([[0.3, -1.1]], dtype=F64)
    rewards = torch.tensor([[[-0.5], [-2.0]]], dtype=F64)
    p1, p2 = torch.sigmoid(logits[0]).tolist()
    prior = p1 * (1 - p2) + (1 - p1) * p2
    want = math.log(prior) + (p1 * (1 - p2) * -0.5 + (1 - p1) * p2 * -2.0) / prior
    got = cb_expected_reward(logits, torch.tensor([1]), rewards, torch.tensor([2]))
    torch.testing.assert_close(got, torch.tensor([want], dtype=F64))


def test_padding_changes_nothing():
    logits, rewards, total, lengths = ragged_batch(3)
    padded = ragged_batch(3, pad_value=float("nan"))
    torch.testing.assert_close(
        cb_expected_reward(logits, total, rewards, lengths),
        cb_expected_reward(padded[0], total, padded[1], lengths),
    )
    alone = [
        cb_expected_reward(
            logits[b : b + 1], total[b : b + 1], rewards[b : b + 1], lengths[b : b + 1]
        )
        for b in range(len(total))
    ]
    torch.testing.assert_close(
        cb_expected_reward(logits, total, rewards, lengths), torch.cat(alone)
    )


def test_is_the_jensen_bound_of_the_exact_marginal():
    # log P(y) >= log P(L) + E[log P(y | b)], with equality when rewards do not depend on t.
    logits, rewards, total, lengths = ragged_batch(4)
    exact = -cb_marginal_nll(logits, rewards, lengths, total)
    bound = cb_expected_reward(logits, total, rewards, lengths)
    assert (bound <= exact + 1e-12).all() and (bound < exact - 1e-6).any()
    flat = rewards[:, :1].expand_as(rewards)  # R[t, l] = R[0, l] for every t
    torch.testing.assert_close(
        cb_expected_reward(logits, total, flat, lengths),
        -cb_marginal_nll(logits, flat, lengths, total),
    )


def test_bad_inputs_name_the_argument():
    logits, rewards, total, lengths = ragged_batch(5)
    with pytest.raises(ValueError, match=r"total\[1\] = 6 > input_lengths\[1\] = 5"):
        cb_expected_reward(logits, torch.tensor([3, 6, 0, 3]), rewards, lengths)
    with pytest.raises(ValueError, match=r"rewards must have shape \(B, T, L\)"):
        cb_expected_reward(logits, total, rewards[:, :-1], lengths)
    with pytest.raises(ValueError, match=r"total\[0\] = 3 > rewards.shape\[2\] = 2"):
        cb_expected_reward(logits, total, rewards[..., :2], lengths)
    nan = rewards.detach().clone()
    nan[1, 2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"rewards\[1, 2, 1\] = nan"):
        cb_expected_reward(logits, total, nan, lengths)
    with pytest.raises(ValueError, match="input_lengths"):
        cb_expected_reward(logits, total, rewards, torch.tensor([7, 5, 4, 3]))
    with pytest.raises(ValueError, match="emit_logits"):
        cb_expected_reward(logits.long(), total, rewards, lengths)
