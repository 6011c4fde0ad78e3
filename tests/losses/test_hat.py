"""hat_nll (HAT paper eq. 4 on the RNN-T lattice) and hat_internal_lm_score (eq. 8)."""

import math

import pytest
import torch
import torch.nn.functional as F
import torchaudio.functional as AF

from cbasr._backends import use_backend
from cbasr.losses import hat_internal_lm_score, hat_nll, hat_nll_from_logits
from tests.backends import BACKENDS, on_triton_keep, skip_interpreted
from tests.reference import lattice_enumeration as ref

F64 = torch.float64

UTTERANCES = [(5, [1, 2, 0]), (4, [2]), (1, [1, 1]), (3, [])]


@pytest.fixture(autouse=True, params=BACKENDS)
def lattice(request):
    """Which transducer lattice serves this test: the compiled CPU loop
    (:mod:`cbasr.losses._transducer_kernel`), the PyTorch recursion or the Triton kernels
    (:mod:`cbasr.losses._transducer_triton`)."""
    with use_backend(request.param):
        yield request.param


def _batch(seed, utterances=UTTERANCES, V=3, dtype=F64, device="cpu", pad_value=None):
    g = torch.Generator().manual_seed(seed)
    B = len(utterances)
    T = max(t for t, _ in utterances)
    U = max(len(y) for _, y in utterances)
    blank_logits = 2 * torch.randn(B, T, U + 1, generator=g, dtype=F64)
    label_log_probs = torch.randn(B, T, U + 1, V, generator=g, dtype=F64).log_softmax(-1)
    targets = torch.full((B, U), -1, dtype=torch.long)
    for b, (tb, y) in enumerate(utterances):
        targets[b, : len(y)] = torch.tensor(y, dtype=torch.long)
        if pad_value is not None:
            blank_logits[b, tb:] = blank_logits[b, :, len(y) + 1 :] = pad_value
            label_log_probs[b, tb:] = label_log_probs[b, :, len(y) + 1 :] = pad_value
    return (
        blank_logits.to(device=device, dtype=dtype).requires_grad_(),
        label_log_probs.to(device=device, dtype=dtype).requires_grad_(),
        targets.to(device),
        torch.tensor([t for t, _ in utterances], device=device),
        torch.tensor([len(y) for _, y in utterances], device=device),
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_enumeration_values_and_gradients(seed, device):
    bl, lp, targets, il, tl = _batch(seed, device=device)
    nll = hat_nll(bl, lp, targets, il, tl)
    g_bl, g_lp = torch.autograd.grad(nll.sum(), (bl, lp))
    for b, (tb, y) in enumerate(UTTERANCES):
        rbl = bl[b].detach().cpu().clone().requires_grad_()
        rlp = lp[b].detach().cpu().clone().requires_grad_()
        want = -ref.hat_log_marginal(rbl[:tb, : len(y) + 1], rlp[:tb, : len(y) + 1], y)
        want_bl, want_lp = torch.autograd.grad(want, (rbl, rlp), allow_unused=True)
        want_lp = torch.zeros_like(rlp) if want_lp is None else want_lp
        torch.testing.assert_close(nll[b].cpu(), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_bl[b].cpu(), want_bl, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g_lp[b].cpu(), want_lp, rtol=1e-10, atol=1e-12)


def test_gradcheck(lattice):
    skip_interpreted(lattice, "gradcheck runs the lattice once per input element")
    bl, lp, targets, il, tl = _batch(2, utterances=[(4, [1, 0]), (2, [1])], V=2)
    assert torch.autograd.gradcheck(lambda x, y: hat_nll(x, y, targets, il, tl), (bl, lp))


def _hat_view_of_rnnt(z):
    """Split an RNN-T softmax over ``[blank] + V`` into HAT's parameters (blank id 0):
    ``b = p_blank``, so its logit is ``log p_blank - log(1 - p_blank) = z_0 - logsumexp(z_1:)``,
    and ``P(y | not blank) = softmax(z_1:)``."""
    blank_logits = z[..., 0] - z[..., 1:].logsumexp(-1)  # (B, T, U + 1)
    return blank_logits, z[..., 1:].log_softmax(-1)  # (B, T, U + 1, V)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_equals_torchaudio_rnnt_on_the_same_distribution(dtype):
    # Independent oracle: torchaudio's RNN-T loss on logits whose softmax is the same
    # distribution; values and the gradient w.r.t. those logits.
    g = torch.Generator().manual_seed(3)
    B, T, U, V = 3, 6, 3, 4
    z = (2 * torch.randn(B, T, U + 1, V + 1, generator=g)).requires_grad_()
    targets = torch.randint(0, V, (B, U), generator=g)  # HAT ids; torchaudio's are + 1
    il, tl = torch.tensor([6, 4, 5]), torch.tensor([3, 3, 1])
    want = AF.rnnt_loss(z, (targets + 1).int(), il.int(), tl.int(), blank=0, reduction="none")
    (want_grad,) = torch.autograd.grad(want.sum(), (z,))
    zd = z.detach().to(dtype).requires_grad_()
    got = hat_nll(*_hat_view_of_rnnt(zd), targets, il, tl)
    (got_grad,) = torch.autograd.grad(got.sum(), (zd,))
    torch.testing.assert_close(got.float(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad.float(), want_grad, rtol=1e-4, atol=1e-5)


def test_hand_worked_value():
    # T = 2, U = 1, V = 2, every blank logit 0 (b = 1/2) and P(y) = 1/2 for both labels.
    # Paths: (1 - b00) P00 b01 b11 and b00 (1 - b10) P10 b11, each (1/2)^4 = 1/16:
    # P(y) = 1/8, -log P(y) = log 8.
    nll = hat_nll(
        torch.zeros(1, 2, 2, dtype=F64),
        torch.full((1, 2, 2, 2), math.log(0.5), dtype=F64),
        torch.tensor([[1]]),
        torch.tensor([2]),
        torch.tensor([1]),
    )
    torch.testing.assert_close(nll, torch.tensor([math.log(8.0)], dtype=F64))


def test_non_blank_branch_is_exact_in_float32():
    # b = sigmoid(40): 1 - b = e^-40 underflows to 0 as 1 - sigmoid in float32, but
    # logsigmoid(-40) = -40 is exact. T = 1, U = 1: the only path is label then blank.
    bl = torch.tensor([[[40.0, 0.0]]])
    lp = torch.full((1, 1, 2, 2), math.log(0.5))
    nll = hat_nll(bl, lp, torch.tensor([[0]]), torch.tensor([1]), torch.tensor([1]))
    want = -(F.logsigmoid(torch.tensor(-40.0, dtype=F64)) + math.log(0.5) + math.log(0.5))
    torch.testing.assert_close(nll.double(), want.reshape(1), rtol=1e-6, atol=0)


def test_batch_and_padding_invariance():
    bl, lp, targets, il, tl = _batch(4, pad_value=float("nan"))
    nll = hat_nll(bl, lp, targets, il, tl)
    g_bl, g_lp = torch.autograd.grad(nll.sum(), (bl, lp))
    assert torch.isfinite(g_bl).all() and torch.isfinite(g_lp).all()
    for b, (tb, y) in enumerate(UTTERANCES):
        u1 = len(y) + 1
        bl1 = bl[b : b + 1, :tb, :u1].detach().clone().requires_grad_()
        lp1 = lp[b : b + 1, :tb, :u1].detach().clone().requires_grad_()
        y1 = targets[b : b + 1, : len(y)]
        one = hat_nll(bl1, lp1, y1, torch.tensor([tb]), torch.tensor([len(y)]))
        g1_bl, g1_lp = torch.autograd.grad(one.sum(), (bl1, lp1))
        torch.testing.assert_close(nll[b : b + 1], one, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_bl[b, :tb, :u1], g1_bl[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_lp[b, :tb, :u1], g1_lp[0], rtol=1e-12, atol=1e-12)
        assert g_bl[b, tb:].abs().sum() == 0 and g_bl[b, :, u1:].abs().sum() == 0
        assert g_lp[b, tb:].abs().sum() == 0 and g_lp[b, :, u1:].abs().sum() == 0


def test_float32_moderate_size_is_stable_and_matches_torchaudio(lattice):
    skip_interpreted(lattice, "a moderate size")
    g = torch.Generator().manual_seed(5)
    B, T, U, V = 2, 300, 60, 32
    z = 2 * torch.randn(B, T, U + 1, V + 1, generator=g)
    targets = torch.randint(0, V, (B, U), generator=g)
    il, tl = torch.tensor([300, 250]), torch.tensor([60, 45])
    out = {}
    for dtype in (torch.float32, F64):
        zd = z.to(dtype).requires_grad_()
        nll = hat_nll(*_hat_view_of_rnnt(zd), targets, il, tl)
        out[dtype] = (nll, *torch.autograd.grad(nll.sum(), (zd,)))
    nll32, g32 = out[torch.float32]
    assert torch.isfinite(nll32).all() and torch.isfinite(g32).all()
    torch.testing.assert_close(nll32.double(), out[F64][0], rtol=1e-6, atol=0)
    # torchaudio's own float32 gradient is off by about 1e-3 here too.
    torch.testing.assert_close(g32.double(), out[F64][1], rtol=0, atol=2e-3)
    ta = AF.rnnt_loss(z, (targets + 1).int(), il.int(), tl.int(), blank=0, reduction="none")
    torch.testing.assert_close(nll32, ta, rtol=1e-5, atol=0)


def test_errors_name_the_argument():
    bl, lp, targets, il, tl = _batch(6)
    with pytest.raises(ValueError, match="label_log_probs must have shape"):
        hat_nll(bl, lp[:, :, :2], targets, il, tl)
    with pytest.raises(ValueError, match="targets must have shape"):
        hat_nll(bl, lp, targets[:, :2], il, tl)
    with pytest.raises(ValueError, match=r"targets\[0, 1\] = 3 must be in \[0, 3\)"):
        hat_nll(bl, lp, torch.where(targets == 2, 3, targets), il, tl)
    with pytest.raises(ValueError, match=r"input_lengths\[0\] = 9"):
        hat_nll(bl, lp, targets, torch.tensor([9, 4, 1, 3]), tl)
    with pytest.raises(ValueError, match="blank_logits must be a floating-point"):
        hat_nll(bl.long(), lp, targets, il, tl)


def test_internal_lm_score():
    # Eq. (8): log P_ILM(y) = sum_u log P(y_{u+1} | y_{0:u}). Hand-worked: y = (1, 0) with
    # P(1 | <s>) = 0.5, P(0 | 1) = 0.25: log(0.5) + log(0.25) = log(1/8).
    probs = torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]], dtype=F64)
    score = hat_internal_lm_score(probs.log(), torch.tensor([[1, 0]]), torch.tensor([2]))
    torch.testing.assert_close(score, torch.tensor([math.log(1 / 8)], dtype=F64))
    # Ragged batch with NaN padding: each row sums its own valid positions only.
    g = torch.Generator().manual_seed(7)
    ilm = torch.randn(3, 4, 5, generator=g, dtype=F64).log_softmax(-1)
    targets = torch.tensor([[1, 4, 2], [3, -1, -1], [-1, -1, -1]])
    lengths = torch.tensor([3, 1, 0])
    ilm[1, 2:] = float("nan")
    ilm.requires_grad_()
    score = hat_internal_lm_score(ilm, targets, lengths)
    want = torch.stack(
        [ilm[0, 0, 1] + ilm[0, 1, 4] + ilm[0, 2, 2], ilm[1, 0, 3], ilm.new_zeros(())]
    )
    torch.testing.assert_close(score, want)
    (grad,) = torch.autograd.grad(score.sum(), (ilm,))
    assert grad.sum().item() == 4 and torch.isfinite(grad).all()
    with pytest.raises(ValueError, match="ilm_log_probs must have shape"):
        hat_internal_lm_score(ilm[:, :3], targets, lengths)
    with pytest.raises(ValueError, match=r"targets\[0, 1\] = 4 must be in \[0, 3\)"):
        hat_internal_lm_score(ilm[..., :3], targets, lengths)


@on_triton_keep(lambda case: case["seed"] < 5)  # each kernel path: the other seeds repeat it
@pytest.mark.parametrize("seed", range(20))
def test_random_sizes_match_enumeration(seed):
    g = torch.Generator().manual_seed(100 + seed)
    utterances = []
    for _ in range(3):
        tb = int(torch.randint(1, 6, (1,), generator=g))
        ub = int(torch.randint(0, 4, (1,), generator=g))
        utterances.append((tb, torch.randint(0, 3, (ub,), generator=g).tolist()))
    if max(len(y) for _, y in utterances) == 0:
        utterances[0] = (utterances[0][0], [1])
    bl, lp, targets, il, tl = _batch(seed, utterances=utterances)
    nll = hat_nll(bl, lp, targets, il, tl)
    g_bl, g_lp = torch.autograd.grad(nll.sum(), (bl, lp))
    for b, (tb, y) in enumerate(utterances):
        rbl = bl[b].detach().clone().requires_grad_()
        rlp = lp[b].detach().clone().requires_grad_()
        want = -ref.hat_log_marginal(rbl[:tb, : len(y) + 1], rlp[:tb, : len(y) + 1], y)
        want_bl, want_lp = torch.autograd.grad(want, (rbl, rlp), allow_unused=True)
        want_lp = torch.zeros_like(rlp) if want_lp is None else want_lp
        torch.testing.assert_close(nll[b], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_bl[b], want_bl, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g_lp[b], want_lp, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("blank_unit", [False, True])
def test_from_logits_equals_the_normalised_loss(blank_unit):
    """hat_nll_from_logits (fused softmax) equals hat_nll on log_softmax'ed scores, in values
    and gradients, with the blank logit separate or as unit 0 of the same joint tensor."""
    bl, lp, targets, il, tl = _batch(3, pad_value=float("nan"))
    scores = torch.randn(lp.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    scores[lp.detach().isnan()] = float("nan")  # padding holds anything: no NaN may leak
    blank = bl.detach().nan_to_num(0.0)
    if blank_unit:
        joint = torch.cat([blank.unsqueeze(-1), scores], -1).requires_grad_()
        got = hat_nll_from_logits(None, joint, targets, il, tl)
        (g_joint,) = torch.autograd.grad(got.sum(), (joint,))
        g_blank, g_scores = g_joint[..., 0], g_joint[..., 1:]
    else:
        b, x = blank.clone().requires_grad_(), scores.clone().requires_grad_()
        got = hat_nll_from_logits(b, x, targets, il, tl)
        g_blank, g_scores = torch.autograd.grad(got.sum(), (b, x))
    b, x = blank.clone().requires_grad_(), scores.nan_to_num(0.0).requires_grad_()
    want = hat_nll(b, x.log_softmax(-1), targets, il, tl)
    w_blank, w_scores = torch.autograd.grad(want.sum(), (b, x))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_blank, w_blank, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_scores, w_scores, rtol=1e-10, atol=1e-12)
    assert not g_scores.isnan().any() and not g_blank.isnan().any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("blank_unit", [False, True])
def test_from_logits_of_a_half_precision_joint_computes_in_float32(blank_unit, dtype):
    """A half-precision joint (autocast's): float32 NLLs equal to the float32 computation on
    the same (rounded) values, and gradients in the joint's dtype equal to the float32 ones
    rounded to it."""
    _, lp, targets, il, tl = _batch(7)
    g = torch.Generator().manual_seed(8)
    joint = (3 * torch.randn(*lp.shape[:-1], lp.shape[-1] + 1, generator=g)).to(dtype)
    inputs = [None, joint] if blank_unit else [joint[..., 0].contiguous(), joint[..., 1:]]
    half = [x if x is None else x.clone().requires_grad_() for x in inputs]
    full = [x if x is None else x.float().requires_grad_() for x in inputs]
    got = hat_nll_from_logits(*half, targets, il, tl)
    want = hat_nll_from_logits(*full, targets, il, tl)
    assert got.dtype == torch.float32 and torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    leaves = [(h, f) for h, f in zip(half, full) if h is not None]
    got_grads = torch.autograd.grad(got.sum(), [h for h, _ in leaves])
    want_grads = torch.autograd.grad(want.sum(), [f for _, f in leaves])
    for grad, wanted in zip(got_grads, want_grads):
        assert grad.dtype == dtype
        torch.testing.assert_close(grad, wanted.to(dtype), rtol=1e-2, atol=1e-3)


@on_triton_keep(lambda case: case["blank_unit"])  # (the other: test_from_logits_equals_...)
@pytest.mark.parametrize("blank_unit", [False, True])
def test_from_logits_over_many_tiles_of_rows_and_on_an_empty_batch(lattice, blank_unit):
    """A joint of 1160 rows (the Triton kernels take it in several tiles of rows) equals the
    normalised loss, in values and gradients; an empty batch gives empty results."""
    g = torch.Generator().manual_seed(9)
    B, T, U, V = 2, 40, 13, 4
    scores = torch.randn(B, T, U + 1, V, generator=g, dtype=F64)
    blank = torch.randn(B, T, U + 1, generator=g, dtype=F64)
    targets = torch.randint(0, V, (B, U), generator=g)
    il, tl = torch.tensor([40, 31]), torch.tensor([13, 9])
    b, x = blank.clone().requires_grad_(), scores.clone().requires_grad_()
    if blank_unit:
        joint = torch.cat([b.unsqueeze(-1), x], -1)
        got = hat_nll_from_logits(None, joint, targets, il, tl)
    else:
        got = hat_nll_from_logits(b, x, targets, il, tl)
    g_blank, g_scores = torch.autograd.grad(got.sum(), (b, x))
    rb, rx = blank.clone().requires_grad_(), scores.clone().requires_grad_()
    want = hat_nll(rb, rx.log_softmax(-1), targets, il, tl)
    w_blank, w_scores = torch.autograd.grad(want.sum(), (rb, rx))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_blank, w_blank, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_scores, w_scores, rtol=1e-10, atol=1e-12)
    empty = torch.zeros(0, T, U + 1, V + 1, dtype=F64, requires_grad=True)
    lengths = torch.zeros(0, dtype=torch.long)
    nll = hat_nll_from_logits(None, empty, targets[:0], lengths, lengths)
    assert nll.shape == (0,) and torch.autograd.grad(nll.sum(), empty)[0].shape == empty.shape


MONOTONIC = [(3, [1, 1, 2]), (5, [2, 2]), (4, [0]), (2, [])]


@pytest.mark.parametrize("blank_unit", [False, True])
def test_monotonic_matches_enumeration_from_logits(blank_unit):
    """HAT on the one-label-per-frame lattice, from unnormalised scores (fused softmax, blank
    separate or unit 0): values and gradients against path enumeration, padding NaN."""
    bl, lp, targets, il, tl = _batch(21, utterances=MONOTONIC, pad_value=float("nan"))
    scores = torch.randn(lp.shape, generator=torch.Generator().manual_seed(22), dtype=F64)
    scores[lp.detach().isnan()] = float("nan")
    blank = bl.detach().nan_to_num(0.0)
    if blank_unit:
        joint = torch.cat([blank.unsqueeze(-1), scores], -1).requires_grad_()
        got = hat_nll_from_logits(None, joint, targets, il, tl, monotonic=True)
        (g_joint,) = torch.autograd.grad(got.sum(), (joint,))
        g_blank, g_scores = g_joint[..., 0], g_joint[..., 1:]
    else:
        b, x = blank.clone().requires_grad_(), scores.clone().requires_grad_()
        got = hat_nll_from_logits(b, x, targets, il, tl, monotonic=True)
        g_blank, g_scores = torch.autograd.grad(got.sum(), (b, x))
    for b, (tb, y) in enumerate(MONOTONIC):
        rbl = blank[b].clone().requires_grad_()
        rx = scores[b].nan_to_num(0.0).requires_grad_()
        want = -ref.hat_log_marginal(
            rbl[:tb, : len(y) + 1], rx.log_softmax(-1)[:tb, : len(y) + 1], y, monotonic=True
        )
        w_bl, w_x = torch.autograd.grad(want, (rbl, rx), allow_unused=True)
        w_bl = torch.zeros_like(rbl) if w_bl is None else w_bl
        w_x = torch.zeros_like(rx) if w_x is None else w_x
        torch.testing.assert_close(got[b], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_blank[b], w_bl, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g_scores[b], w_x, rtol=1e-10, atol=1e-12)
    # the same weights on the RNN-T lattice give another value (where there are labels)
    standard = hat_nll_from_logits(blank, scores.nan_to_num(0.0), targets, il, tl)
    assert (standard - got.detach())[:-1].abs().min() > 1e-3


def test_monotonic_gradcheck(lattice):
    skip_interpreted(lattice, "gradcheck runs the lattice once per input element")
    bl, lp, targets, il, tl = _batch(23, utterances=MONOTONIC)
    assert torch.autograd.gradcheck(
        lambda b, p: hat_nll(b, p, targets, il, tl, monotonic=True), (bl, lp)
    )
