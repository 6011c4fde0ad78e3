"""ctc_nll: the thin wrapper over torch.nn.functional.ctc_loss."""

import math

import pytest
import torch

from cbasr.losses import ctc_nll
from tests.reference import lattice_enumeration as ref

F64 = torch.float64

# (T_b, targets): repeats, no repeats, the tightest fit (L + repeats = T), empty.
UTTERANCES = [(6, [1, 2, 2]), (5, [2, 1]), (3, [1, 1]), (4, [])]


def _batch(seed, utterances=UTTERANCES, V=3, dtype=F64, device="cpu", pad_value=0.0):
    g = torch.Generator().manual_seed(seed)
    B = len(utterances)
    T = max(t for t, _ in utterances)
    L = max(max(len(y) for _, y in utterances), 1)
    logits = 2 * torch.randn(B, T, V, generator=g, dtype=F64)
    targets = torch.full((B, L), -1, dtype=torch.long)  # -1: padding, never read
    for b, (tb, y) in enumerate(utterances):
        logits[b, tb:] = pad_value
        targets[b, : len(y)] = torch.tensor(y, dtype=torch.long)
    return (
        logits.to(device=device, dtype=dtype).requires_grad_(),
        targets.to(device),
        torch.tensor([t for t, _ in utterances], device=device),
        torch.tensor([len(y) for _, y in utterances], device=device),
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_enumeration_of_alignments(seed, device):
    # Gradients are taken w.r.t. the logits before log_softmax (see ctc_nll's docstring).
    logits, targets, il, tl = _batch(seed, device=device)
    nll = ctc_nll(logits.log_softmax(-1), targets, il, tl)
    (grad,) = torch.autograd.grad(nll.sum(), (logits,))
    for b, (tb, y) in enumerate(UTTERANCES):
        z = logits[b].detach().cpu().clone().requires_grad_()
        want = -ref.ctc_log_marginal(z[:tb].log_softmax(-1), y, blank=0)
        (want_grad,) = torch.autograd.grad(want, (z,))
        torch.testing.assert_close(nll[b].cpu(), want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(grad[b].cpu(), want_grad, rtol=1e-8, atol=1e-10)


def test_hand_worked_value():
    # T = 2, V = {blank, a}, y = (a). Alignments: "a a", "a -", "- a".
    # P(a) = (0.6, 0.3) per frame: P(y) = 0.6*0.3 + 0.6*0.7 + 0.4*0.3 = 0.18 + 0.42 + 0.12 = 0.72.
    probs = torch.tensor([[[0.4, 0.6], [0.7, 0.3]]], dtype=F64)
    nll = ctc_nll(probs.log(), torch.tensor([[1]]), torch.tensor([2]), torch.tensor([1]))
    torch.testing.assert_close(nll, torch.tensor([-math.log(0.72)], dtype=F64))


def test_gradcheck_through_log_softmax():
    logits, targets, il, tl = _batch(2)
    assert torch.autograd.gradcheck(
        lambda z: ctc_nll(z.log_softmax(-1), targets, il, tl), (logits,)
    )


def test_batch_and_padding_invariance():
    logits, targets, il, tl = _batch(3, pad_value=1e3)
    nll = ctc_nll(logits.log_softmax(-1), targets, il, tl)
    (grad,) = torch.autograd.grad(nll.sum(), (logits,))
    for b, (tb, y) in enumerate(UTTERANCES):
        z = logits[b : b + 1, :tb].detach().clone().requires_grad_()
        one = ctc_nll(
            z.log_softmax(-1), torch.tensor([y or [1]]), torch.tensor([tb]), torch.tensor([len(y)])
        )
        (g1,) = torch.autograd.grad(one.sum(), (z,))
        torch.testing.assert_close(nll[b : b + 1], one, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad[b, :tb], g1[0], rtol=1e-12, atol=1e-12)
        assert grad[b, tb:].abs().sum() == 0


def test_float32_long_utterances_are_stable():
    g = torch.Generator().manual_seed(4)
    B, T, L, V = 2, 2000, 400, 50
    logits64 = torch.randn(B, T, V, generator=g, dtype=F64)
    targets = torch.randint(1, V, (B, L), generator=g)
    il, tl = torch.tensor([2000, 1700]), torch.tensor([400, 350])
    out = {}
    for dtype in (torch.float32, F64):
        z = logits64.to(dtype).requires_grad_()
        nll = ctc_nll(z.log_softmax(-1), targets, il, tl)
        out[dtype] = (nll, *torch.autograd.grad(nll.sum(), (z,)))
    assert torch.isfinite(out[torch.float32][0]).all()
    assert torch.isfinite(out[torch.float32][1]).all()
    torch.testing.assert_close(out[torch.float32][0].double(), out[F64][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(out[torch.float32][1].double(), out[F64][1], rtol=0, atol=1e-2)


def test_no_alignment_gives_inf():
    # y = (1, 1) needs a blank between the repeats: 3 frames; 2 are not enough.
    logits, targets, il, tl = _batch(5, utterances=[(2, [1, 1]), (3, [1, 1])])
    nll = ctc_nll(logits.log_softmax(-1), targets, il, tl)
    assert nll[0].item() == float("inf") and torch.isfinite(nll[1])


def test_errors_name_the_argument():
    logits, targets, il, tl = _batch(6)
    lp = logits.log_softmax(-1)
    with pytest.raises(ValueError, match=r"targets\[0, 1\] = 0 must be in \[0, 3\) and != blank"):
        ctc_nll(lp, torch.tensor([[1, 0, 2], [2, 1, 0], [1, 1, 0], [0, 0, 0]]), il, tl)
    with pytest.raises(ValueError, match=r"targets\[1, 0\] = 3"):
        ctc_nll(lp, torch.tensor([[1, 2, 2], [3, 1, 0], [1, 1, 0], [0, 0, 0]]), il, tl)
    with pytest.raises(ValueError, match="targets must have shape"):
        ctc_nll(lp, targets[:2], il, tl)
    with pytest.raises(ValueError, match="log_probs must have shape"):
        ctc_nll(lp[0], targets, il, tl)
    with pytest.raises(ValueError, match=r"input_lengths\[0\] = 7"):
        ctc_nll(lp, targets, torch.tensor([7, 5, 3, 4]), tl)
    with pytest.raises(ValueError, match="blank = 3"):
        ctc_nll(lp, targets, il, tl, blank=3)
