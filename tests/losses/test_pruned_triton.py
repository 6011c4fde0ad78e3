"""The simple loss on the Triton backend (:mod:`cbasr.losses._pruned_triton`) against the
PyTorch backend (itself checked against the explicit joint and enumeration in test_pruned.py,
where the Triton backend runs the small cases): on CPU in Triton's interpreter."""

import itertools

import pytest
import torch

from cbasr._backends import use_backend
from cbasr.losses import _pruned_triton, simple_transducer_nll

pytestmark = pytest.mark.triton

F64 = torch.float64


@pytest.mark.parametrize(
    "criterion, monotonic, dtype",
    [
        ("rnnt", False, F64),
        ("hat", True, torch.float32),
        pytest.param("hat", False, F64, marks=pytest.mark.slow),
        pytest.param("rnnt", True, torch.float32, marks=pytest.mark.slow),
    ],
)
def test_fused_simple_loss_over_many_blocks_equals_the_pytorch_backend(
    criterion, monotonic, dtype, device, monkeypatch
):
    """The Triton kernels' simple loss (edges, lattice, windows; the gradient of each side) at
    sizes past their blocks (70 units, 20 label positions, 20 frames), NaN in the padded frames
    and label positions, one utterance without labels: the PyTorch backend's NLLs, windows and
    gradients."""
    g = torch.Generator().manual_seed(23)
    B, T, U, V, S = 3, 20, 19, 70, 4
    il, tl = torch.tensor([20, 13, 9]), torch.tensor([19, 8, 0])
    targets = torch.randint(1, V, (B, U), generator=g)
    am = 2 * torch.randn(B, T, V, generator=g, dtype=F64)
    lm = 2 * torch.randn(B, U + 1, V, generator=g, dtype=F64)
    am[1, 13:], am[2, 9:] = float("nan"), float("nan")
    lm[1, 9:], lm[2, 1:] = float("nan"), float("nan")
    hat = criterion == "hat"
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=dtype)
    results = {}
    fused = []  # the Triton backend takes the kernels' path, not the PyTorch one
    apply = _pruned_triton.SimpleLoss.apply
    monkeypatch.setattr(_pruned_triton.SimpleLoss, "apply", lambda *a: fused.append(1) or apply(*a))
    for backend, where in (("triton", device), ("torch", "cpu")):
        a = am.to(where, dtype).requires_grad_()
        b = lm.to(where, dtype).requires_grad_()
        args = (targets.to(where), il.to(where), tl.to(where), S, hat, monotonic)
        with use_backend(backend):
            nll, starts = simple_transducer_nll(a, b, *args)
        grads = torch.autograd.grad((weights.to(where) * nll).sum(), (a, b))
        results[backend] = [t.detach().cpu() for t in (nll, starts, *grads)]
    assert fused == [1]
    (nll, starts, grad_am, grad_lm), want = results["triton"], results["torch"]
    assert torch.isfinite(want[0]).all() and nll.dtype == dtype
    assert torch.equal(starts, want[1])
    tolerance = {"rtol": 1e-12, "atol": 1e-12} if dtype == F64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(nll, want[0], **tolerance)
    torch.testing.assert_close(grad_am, want[2], **tolerance)
    torch.testing.assert_close(grad_lm, want[3], **tolerance)
    assert (grad_am[1, 13:] == 0).all() and (grad_lm[1, 9:] == 0).all()
    assert (grad_lm[2, 1:] == 0).all() and grad_lm[2, 0].abs().sum() > 0


@pytest.mark.parametrize("monotonic", [False, True])
def test_the_windows_kernel_is_prune_ranges_where_the_bounds_bind(monotonic, device):
    """The windows from posteriors whose mass sits low (the last frames must climb to the
    labels), high (the first frames cannot rise that fast) and at random, with full-block
    lattices (16 positions) and padded frames: :func:`cbasr.losses.prune_ranges`'s starts, and
    ``-log P(y)`` (``inf`` where it is ``-inf``)."""
    from cbasr.losses import _pruned_triton, prune_ranges

    g = torch.Generator().manual_seed(5)
    B, T, U1 = 4, 12, 16
    il = torch.tensor([12, 8, 12, 5])
    for where, S in itertools.product(("low", "high", "random"), (2, 3, 5)):
        # a full lattice where the windows hold its labels (one label a frame for S = 2)
        tl = torch.tensor([11 if S == 2 or monotonic else 15, 7, 9, 0])
        occupancy = torch.rand(B, T, U1, generator=g, dtype=F64) * 1e-3
        if where == "low":
            occupancy[:, :, 0] = 1.0
        if where == "high":
            occupancy[torch.arange(B), :, tl] = 1.0
        if where == "random":
            occupancy = torch.rand(B, T, U1, generator=g, dtype=F64)
        blank, emit = occupancy / 2, occupancy[..., :-1] / 2  # the kernel sums the two
        blank[..., -1] = occupancy[..., -1]
        log_p = torch.tensor([-3.0, float("-inf"), -1.5, 0.0], dtype=F64)
        want = prune_ranges(occupancy, il, tl, S, monotonic=monotonic)
        nll, got = _pruned_triton.windows(
            *(x.to(device) for x in (blank, emit, log_p, il, tl)), S, monotonic
        )
        assert torch.equal(got.cpu(), want), (where, S)
        assert nll.cpu().tolist() == [3.0, float("inf"), 1.5, -0.0]


@pytest.mark.parametrize("criterion", ["rnnt", "hat"])
def test_half_precision_sides_take_the_kernels_and_sum_in_float32(criterion, device, monkeypatch):
    """bfloat16 sides (``simple_am`` and ``simple_lm`` under autocast): on the Triton backend
    the kernels' path, not the PyTorch one; on both backends the float32 loss and windows of
    the same (rounded) sides, and each side's gradient in bfloat16."""
    g = torch.Generator().manual_seed(29)
    B, T, U, V, S = 2, 9, 4, 11, 3
    il, tl = torch.tensor([9, 6]), torch.tensor([4, 2])
    targets = torch.randint(1, V, (B, U), generator=g)
    am = (2 * torch.randn(B, T, V, generator=g)).bfloat16()
    lm = (2 * torch.randn(B, U + 1, V, generator=g)).bfloat16()
    hat = criterion == "hat"
    fused = []
    apply = _pruned_triton.SimpleLoss.apply
    monkeypatch.setattr(_pruned_triton.SimpleLoss, "apply", lambda *a: fused.append(1) or apply(*a))
    args = (targets, il, tl, S, hat)
    want, want_starts = simple_transducer_nll(am.float(), lm.float(), *args)
    for backend, where in (("triton", device), ("torch", "cpu")):
        a, b = am.to(where).requires_grad_(), lm.to(where).requires_grad_()
        with use_backend(backend):
            nll, starts = simple_transducer_nll(a, b, *(x.to(where) for x in args[:3]), S, hat)
        assert nll.dtype == torch.float32, backend
        torch.testing.assert_close(nll.cpu(), want, rtol=1e-5, atol=1e-5)
        assert torch.equal(starts.cpu(), want_starts)
        grads = torch.autograd.grad(nll.sum(), (a, b))
        assert [x.dtype for x in grads] == [torch.bfloat16] * 2
        assert all(torch.isfinite(x).all() and x.abs().sum() > 0 for x in grads)
    assert fused == [1]
