"""rnnt_nll (torchaudio wrapper) and transducer_lattice_nll (the gather-first lattice)."""

import math

import pytest
import torch
import torch.nn.functional as F
import torchaudio.functional as AF

from cbasr._backends import use_backend
from cbasr.losses import gather_logsumexp, rnnt_lattice_nll, rnnt_nll, transducer_lattice_nll
from tests.backends import BACKENDS, interpreted, on_triton_keep
from tests.reference import lattice_enumeration as ref

F64 = torch.float64

# (T_b, targets): U_b = U, shorter, one frame, empty.
UTTERANCES = [(5, [1, 2, 2]), (4, [2]), (1, [1, 1]), (3, [])]


@pytest.fixture(autouse=True, params=BACKENDS)
def lattice(request):
    """Which transducer lattice serves this test: the compiled CPU loop
    (:mod:`cbasr.losses._transducer_kernel`), the PyTorch recursion or the Triton kernels
    (:mod:`cbasr.losses._transducer_triton`)."""
    with use_backend(request.param):
        yield request.param


def _joint(seed, utterances=UTTERANCES, V=3, extra_t=0, extra_u=0, dtype=torch.float32):
    """Random RNN-T logits ``(B, T, U + 1, V)`` with blank 0, padded ``extra_*`` beyond the
    longest utterance, and ``-1`` in padded target positions."""
    g = torch.Generator().manual_seed(seed)
    B = len(utterances)
    T = max(t for t, _ in utterances) + extra_t
    U = max(len(y) for _, y in utterances) + extra_u
    logits = 2 * torch.randn(B, T, U + 1, V, generator=g)
    targets = torch.full((B, U), -1, dtype=torch.long)
    for b, (_, y) in enumerate(utterances):
        targets[b, : len(y)] = torch.tensor(y, dtype=torch.long)
    il = torch.tensor([t for t, _ in utterances])
    tl = torch.tensor([len(y) for _, y in utterances])
    return logits.to(dtype).requires_grad_(), targets, il, tl


def test_rnnt_equals_torchaudio():
    logits, targets, il, tl = _joint(0)
    got = rnnt_nll(logits, targets, il, tl, blank=0)
    want = AF.rnnt_loss(
        logits, targets.clamp(min=0).int(), il.int(), tl.int(), blank=0, reduction="none"
    )
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("extra", [(0, 0), (2, 1)])
def test_rnnt_matches_enumeration_and_ignores_extra_padding(extra):
    # extra padding beyond the longest utterance is sliced off before torchaudio.
    logits, targets, il, tl = _joint(1, extra_t=extra[0], extra_u=extra[1])
    nll = rnnt_nll(logits, targets, il, tl)
    (grad,) = torch.autograd.grad(nll.sum(), (logits,))
    for b, (tb, y) in enumerate(UTTERANCES):
        z = logits[b].detach().double().requires_grad_()
        want = -ref.rnnt_log_marginal(z[:tb, : len(y) + 1], y, blank=0)
        (want_grad,) = torch.autograd.grad(want, (z,))
        torch.testing.assert_close(nll[b].double(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad[b].double(), want_grad, rtol=1e-4, atol=1e-5)


def test_rnnt_hand_worked_value():
    # T = 2, U = 1, V = {blank, a}, all logits 0: every edge has probability 1/2. The two
    # paths (a, -, -) and (-, a, -) have 3 edges each: P(y) = 2 / 8, -log P(y) = log 4.
    nll = rnnt_nll(
        torch.zeros(1, 2, 2, 2), torch.tensor([[1]]), torch.tensor([2]), torch.tensor([1])
    )
    torch.testing.assert_close(nll, torch.tensor([math.log(4.0)]))


def test_rnnt_errors():
    logits, targets, il, tl = _joint(2)
    with pytest.raises(ValueError, match="float32 or float16"):
        rnnt_nll(logits.double(), targets, il, tl)
    with pytest.raises(ValueError, match=r"targets\[0, 0\] = 0 must be in \[0, 3\) and != blank"):
        rnnt_nll(logits, torch.where(targets == 1, 0, targets), il, tl)
    with pytest.raises(ValueError, match=r"targets\[0, 1\] = 5"):
        rnnt_nll(logits, torch.where(targets == 2, 5, targets), il, tl)
    with pytest.raises(ValueError, match=r"input_lengths\[3\] = 0 is outside \[1, 5\]"):
        rnnt_nll(logits, targets, torch.tensor([5, 4, 1, 0]), tl)
    with pytest.raises(ValueError, match="targets must have shape"):
        rnnt_nll(logits, targets[:, :2], il, tl)


def _lattice_inputs(seed, utterances=UTTERANCES):
    g = torch.Generator().manual_seed(seed)
    B = len(utterances)
    T = max(t for t, _ in utterances)
    U = max(len(y) for _, y in utterances)
    blank = -2 * torch.rand(B, T, U + 1, generator=g, dtype=F64)
    emit = -2 * torch.rand(B, T, U, generator=g, dtype=F64)
    il = torch.tensor([t for t, _ in utterances])
    tl = torch.tensor([len(y) for _, y in utterances])
    return blank.requires_grad_(), emit.requires_grad_(), il, tl


def test_lattice_matches_enumeration_and_gradcheck(device, lattice):
    blank, emit, il, tl = _lattice_inputs(3)
    blank_d = blank.detach().to(device).requires_grad_()
    emit_d = emit.detach().to(device).requires_grad_()
    nll = transducer_lattice_nll(blank_d, emit_d, il.to(device), tl.to(device))
    g_blank, g_emit = torch.autograd.grad(nll.sum(), (blank_d, emit_d))
    for b, (tb, y) in enumerate(UTTERANCES):
        rb = blank[b].detach().clone().requires_grad_()
        re = emit[b].detach().clone().requires_grad_()
        want = -ref.transducer_log_marginal(rb[:tb, : len(y) + 1], re[:tb, : len(y)])
        wb, we = torch.autograd.grad(want, (rb, re), allow_unused=True)
        we = torch.zeros_like(re) if we is None else we
        torch.testing.assert_close(nll[b].cpu(), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_blank[b].cpu(), wb, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g_emit[b].cpu(), we, rtol=1e-10, atol=1e-12)
    if not interpreted(lattice):  # (the gradients were checked against enumeration above)
        assert torch.autograd.gradcheck(
            lambda x, y: transducer_lattice_nll(x, y, il, tl), (blank, emit)
        )


def test_lattice_zero_probability_gives_inf_and_zero_gradient():
    blank, emit, il, tl = _lattice_inputs(4, utterances=[(3, [1, 2]), (3, [1, 2])])
    dead = emit.detach().clone()
    dead[0, :, 1] = float("-inf")  # label 2 of utterance 0 can never be emitted
    dead.requires_grad_()
    nll = transducer_lattice_nll(blank, dead, il, tl)
    assert nll[0].item() == float("inf") and torch.isfinite(nll[1])
    g_blank, g_emit = torch.autograd.grad(nll.sum(), (blank, dead))
    assert torch.isfinite(g_blank).all() and torch.isfinite(g_emit).all()
    assert g_blank[0].abs().sum() == 0 and g_emit[0].abs().sum() == 0


def test_lattice_errors():
    blank, emit, il, tl = _lattice_inputs(5)
    with pytest.raises(ValueError, match="emit_log_probs must have shape"):
        transducer_lattice_nll(blank, emit[:, :, :2], il, tl)
    with pytest.raises(ValueError, match=r"target_lengths\[0\] = 4"):
        transducer_lattice_nll(blank, emit, il, torch.tensor([4, 1, 2, 0]))


@pytest.mark.parametrize("extra", [(0, 0), (2, 1)])
def test_rnnt_lattice_matches_enumeration_and_torchaudio(extra):
    """The fused-gather RNN-T loss: values and gradients against enumeration in float64, and
    torchaudio's loss and gradient in float32, padding beyond the longest utterance included."""
    logits, targets, il, tl = _joint(1, extra_t=extra[0], extra_u=extra[1], dtype=F64)
    nll = rnnt_lattice_nll(logits, targets, il, tl)
    (grad,) = torch.autograd.grad(nll.sum(), (logits,))
    for b, (tb, y) in enumerate(UTTERANCES):
        z = logits[b].detach().clone().requires_grad_()
        want = -ref.rnnt_log_marginal(z[:tb, : len(y) + 1], y, blank=0)
        (want_grad,) = torch.autograd.grad(want, (z,))
        torch.testing.assert_close(nll[b], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad[b], want_grad, rtol=1e-10, atol=1e-12)
    x = logits.detach().float().requires_grad_()
    ours = rnnt_lattice_nll(x, targets, il, tl)
    (ours_grad,) = torch.autograd.grad(ours.sum(), (x,))
    y = logits.detach().float().requires_grad_()
    theirs = rnnt_nll(y, targets, il, tl)
    (theirs_grad,) = torch.autograd.grad(theirs.sum(), (y,))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-4, atol=1e-5)


def test_gather_logsumexp_gradcheck_and_blocks(lattice, monkeypatch):
    """Against gather and logsumexp by autograd, in blocks of rows smaller than the tensor,
    with a normaliser that skips column 0, and weights on both outputs of either sign
    (gradcheck's) or not negative (a loss's)."""
    from cbasr.losses import _joint

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 4, 5, generator=g, dtype=F64, requires_grad=True)
    index = torch.randint(0, 5, (2, 3, 4, 2), generator=g)
    monkeypatch.setattr(_joint, "_CHUNK_ELEMENTS", 7)  # blocks of one or two rows
    monkeypatch.setattr(_joint, "_BACKWARD_ELEMENTS", 11)
    for start in (0, 1):
        picked, lse = gather_logsumexp(x, index, start)
        torch.testing.assert_close(picked, x.gather(-1, index))
        torch.testing.assert_close(lse, torch.logsumexp(x[..., start:], -1))
        assert torch.autograd.gradcheck(
            lambda x, s=start: gather_logsumexp(x, index, s),
            (x,),
            fast_mode=interpreted(lattice),  # (its random projections: 2 calls, not 2 per entry)
        )
        (only_lse,) = torch.autograd.grad(gather_logsumexp(x, index, start)[1].sum(), (x,))
        (want,) = torch.autograd.grad(torch.logsumexp(x[..., start:], -1).sum(), (x,))
        torch.testing.assert_close(only_lse, want)


def test_gather_logsumexp_computes_half_precision_in_float32():
    """A float16 joint (autocast's) gives float32 outputs equal to the float32 computation on
    the same values, and a gradient equal to it rounded to float16: peaky rows, tiny weights."""
    g = torch.Generator().manual_seed(7)
    x16 = (5 * torch.randn(16, 300, generator=g)).half().requires_grad_()
    x32 = x16.detach().float().requires_grad_()
    index = torch.randint(0, 300, (16, 2), generator=g)
    weights = 1e-3 * torch.rand(16, 2, generator=g), 1e-3 * torch.rand(16, generator=g)
    outputs = []
    for x in (x16, x32):
        picked, lse = gather_logsumexp(x, index)
        assert picked.dtype == lse.dtype == torch.float32
        ((picked * weights[0]).sum() + (lse * weights[1]).sum()).backward()
        outputs.append((picked, lse))
    torch.testing.assert_close(outputs[0], outputs[1])
    assert x16.grad.dtype == torch.float16
    torch.testing.assert_close(x16.grad, x32.grad.half())


# ---- the one-label-per-frame (monotonic) lattice ---------------------------------------------

# U_b = T_b, U_b < T_b, a repeated label, empty, and more labels than frames (no path).
MONOTONIC = [(3, [1, 1, 2]), (5, [2, 2]), (4, [1]), (2, []), (1, [1, 2])]


def test_monotonic_lattice_matches_enumeration_and_gradcheck(device, lattice):
    blank, emit, il, tl = _lattice_inputs(11, utterances=MONOTONIC)
    blank_d = blank.detach().to(device).requires_grad_()
    emit_d = emit.detach().to(device).requires_grad_()
    nll = transducer_lattice_nll(blank_d, emit_d, il.to(device), tl.to(device), monotonic=True)
    g_blank, g_emit = torch.autograd.grad(nll[:-1].sum(), (blank_d, emit_d))
    for b, (tb, y) in enumerate(MONOTONIC[:-1]):
        rb = blank[b].detach().clone().requires_grad_()
        re = emit[b].detach().clone().requires_grad_()
        want = -ref.transducer_log_marginal(rb[:tb, : len(y) + 1], re[:tb, : len(y)], True)
        wb, we = torch.autograd.grad(want, (rb, re), allow_unused=True)
        wb = torch.zeros_like(rb) if wb is None else wb  # U_b = T_b: no blank on any path
        we = torch.zeros_like(re) if we is None else we
        torch.testing.assert_close(nll[b].cpu(), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_blank[b].cpu(), wb, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g_emit[b].cpu(), we, rtol=1e-10, atol=1e-12)
    # two labels in one frame: no path of the monotonic lattice, while the RNN-T lattice has one
    assert nll[-1].item() == float("inf")
    assert torch.isfinite(transducer_lattice_nll(blank, emit, il, tl)[-1])
    if interpreted(lattice):  # (the gradients were checked against enumeration above)
        return
    assert torch.autograd.gradcheck(
        lambda x, y: transducer_lattice_nll(x, y, il[:-1], tl[:-1], monotonic=True),
        (blank[:-1].detach().requires_grad_(), emit[:-1].detach().requires_grad_()),
    )


def test_monotonic_lattice_hand_worked_value_and_no_path_gradient():
    # T = 2, U = 1, every edge weight 1/2: paths (a, -) and (-, a), two edges each: P = 2 / 4.
    half = math.log(0.5)
    nll = transducer_lattice_nll(
        torch.full((1, 2, 2), half),
        torch.full((1, 2, 1), half),
        torch.tensor([2]),
        torch.tensor([1]),
        monotonic=True,
    )
    torch.testing.assert_close(nll, torch.tensor([math.log(2.0)]))
    blank, emit, il, tl = _lattice_inputs(12, utterances=[(2, [1, 2, 1]), (3, [2])])
    nll = transducer_lattice_nll(blank, emit, il, tl, monotonic=True)
    assert nll[0].item() == float("inf") and torch.isfinite(nll[1])
    g_blank, g_emit = torch.autograd.grad(nll.sum(), (blank, emit))
    assert torch.isfinite(g_blank).all() and torch.isfinite(g_emit).all()
    assert g_blank[0].abs().sum() == 0 and g_emit[0].abs().sum() == 0


def test_monotonic_lattice_float32_and_padding():
    """float32 equals float64; padding the batch (frames and labels) changes nothing."""
    blank, emit, il, tl = _lattice_inputs(13, utterances=MONOTONIC[:-1])
    want = transducer_lattice_nll(blank, emit, il, tl, monotonic=True)
    got = transducer_lattice_nll(blank.float(), emit.float(), il, tl, monotonic=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    padded_blank = F.pad(blank.detach(), (0, 2, 0, 3), value=float("nan"))
    padded_emit = F.pad(emit.detach(), (0, 2, 0, 3), value=float("nan"))
    padded = transducer_lattice_nll(padded_blank, padded_emit, il, tl, monotonic=True)
    torch.testing.assert_close(padded, want.detach(), rtol=1e-12, atol=1e-12)


@on_triton_keep(lambda case: not case["monotonic"])  # (monotonic: test_monotonic_lattice_...)
@pytest.mark.parametrize("monotonic", [False, True])
def test_lattice_float32_follows_float64_on_a_longer_batch(monotonic):
    """T = 40 frames, U = 12 labels, weights of a real scale (log-probabilities near -3 and
    -0.05): float32 values and gradients stay close to float64."""
    utterances = [(40, [1] * 12), (31, [2] * 9)]
    blank, emit, il, tl = _lattice_inputs(17, utterances=utterances)
    blank = (blank.detach() * 0.05).requires_grad_()  # near -0.05: blanks are likely
    emit = (emit.detach() * 2 - 1).requires_grad_()  # near -3
    out = {}
    for dtype in (torch.float32, F64):
        b, e = blank.detach().to(dtype).requires_grad_(), emit.detach().to(dtype).requires_grad_()
        nll = transducer_lattice_nll(b, e, il, tl, monotonic=monotonic)
        out[dtype] = (nll, *torch.autograd.grad(nll.sum(), (b, e)))
    for got, want in zip(out[torch.float32], out[F64]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_monotonic_rnnt_lattice_matches_enumeration():
    utterances = MONOTONIC[:-1]
    logits, targets, il, tl = _joint(14, utterances=utterances, dtype=F64)
    nll = rnnt_lattice_nll(logits, targets, il, tl, monotonic=True)
    (grad,) = torch.autograd.grad(nll.sum(), (logits,))
    for b, (tb, y) in enumerate(utterances):
        z = logits[b].detach().clone().requires_grad_()
        want = -ref.rnnt_log_marginal(z[:tb, : len(y) + 1], y, blank=0, monotonic=True)
        (want_grad,) = torch.autograd.grad(want, (z,))
        torch.testing.assert_close(nll[b], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad[b], want_grad, rtol=1e-10, atol=1e-12)
