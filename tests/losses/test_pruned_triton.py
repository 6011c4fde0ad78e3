"""The simple loss on the Triton backend (:mod:`cbasr.losses._pruned_triton`) against the
PyTorch backend (itself checked against the explicit joint and enumeration in test_pruned.py,
where the Triton backend runs the small cases): on CPU in Triton's interpreter."""

import pytest
import torch

from cbasr._backends import use_backend
from cbasr.losses import simple_transducer_nll

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
    criterion, monotonic, dtype, device
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
    for backend, where in (("triton", device), ("torch", "cpu")):
        a = am.to(where, dtype).requires_grad_()
        b = lm.to(where, dtype).requires_grad_()
        args = (targets.to(where), il.to(where), tl.to(where), S, hat, monotonic)
        with use_backend(backend):
            nll, starts = simple_transducer_nll(a, b, *args)
        grads = torch.autograd.grad((weights.to(where) * nll).sum(), (a, b))
        results[backend] = [t.detach().cpu() for t in (nll, starts, *grads)]
    (nll, starts, grad_am, grad_lm), want = results["triton"], results["torch"]
    assert torch.isfinite(want[0]).all() and nll.dtype == dtype
    assert torch.equal(starts, want[1])
    tolerance = {"rtol": 1e-12, "atol": 1e-12} if dtype == F64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(nll, want[0], **tolerance)
    torch.testing.assert_close(grad_am, want[2], **tolerance)
    torch.testing.assert_close(grad_lm, want[3], **tolerance)
    assert (grad_am[1, 13:] == 0).all() and (grad_lm[1, 9:] == 0).all()
    assert (grad_lm[2, 1:] == 0).all() and grad_lm[2, 0].abs().sum() > 0
