"""The CTC lattice's Triton kernels (:mod:`cbasr.losses._ctc_triton`, the loss of a CUDA graph's
step) against brute-force enumeration in float64 and against torch's ``ctc_loss`` (values and
gradients through a ``log_softmax``): on CPU in Triton's interpreter."""

import math

import pytest
import torch
import torch.nn.functional as F

import tests.reference.lattice_enumeration as ref
from cbasr._backends import use_backend
from cbasr.checks import graph_step
from cbasr.losses import ctc_nll

pytestmark = pytest.mark.triton

F64 = torch.float64


def _triton():
    from cbasr.losses import _ctc_triton

    return _ctc_triton


def test_the_kernels_sum_every_alignment(device):
    """Tiny cases against the enumeration of ``V^T``: repeats (which need a blank between),
    a lone label, no label, one frame with and without a label, no frame, and two with no
    alignment (inf, zero gradient): "1 1" in 2 frames, a label in none."""
    g = torch.Generator().manual_seed(5)
    T, V = 4, 3
    targets = torch.tensor([[1, 1], [2, 1], [2, 0], [0, 0], [2, 0], [0, 0], [0, 0], [1, 1], [1, 0]])
    target_lens = torch.tensor([2, 2, 1, 0, 1, 0, 0, 2, 1])
    input_lens = torch.tensor([4, 3, 4, 2, 1, 1, 0, 2, 0])
    z = torch.randn(9, T, V, generator=g, dtype=F64, requires_grad=True)
    lp = z.log_softmax(-1)
    nll = _triton().ctc_nll(lp.to(device), targets, input_lens, target_lens, 0).cpu()
    values = nll.detach()
    for b in range(9):
        tb, ub = int(input_lens[b]), int(target_lens[b])
        if tb == 0:  # no frame: probability 1 of no label, 0 of any
            assert float(values[b]) == (0.0 if ub == 0 else math.inf), b
            continue
        want = -ref.ctc_log_marginal(lp[b, :tb].detach(), targets[b, :ub].tolist(), blank=0)
        assert float(values[b]) == pytest.approx(float(want), rel=1e-12), b
    assert math.isinf(values[7])
    (grad,) = torch.autograd.grad(nll[:7].sum(), z)
    want = torch.zeros_like(z)
    for b in range(6):
        zb = z[b : b + 1, : int(input_lens[b])].detach().requires_grad_()
        value = -ref.ctc_log_marginal(
            zb[0].log_softmax(-1), targets[b, : int(target_lens[b])].tolist()
        )
        want[b, : int(input_lens[b])] = torch.autograd.grad(value, zb)[0][0]
    assert torch.allclose(grad, want, atol=1e-12)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_the_kernels_are_torch_s_ctc_loss(dtype, device):
    """A batch past one block of states (30 labels: 61 states), padded frames and labels, a
    blank id that is not 0, weighted utterances: torch's values and gradients w.r.t. the logits."""
    g = torch.Generator().manual_seed(11)
    B, T, V, L, blank = 4, 70, 9, 30, 4
    input_lens = torch.tensor([5, 64, 31, 70])  # the last utterance fills T: no write past it
    target_lens = torch.tensor([0, 12, 7, 30])
    targets = torch.randint(0, V - 1, (B, L), generator=g)
    targets = torch.where(targets >= blank, targets + 1, targets)  # never the blank
    targets[3, 3:6] = targets[3, 2]  # repeats
    z = (2 * torch.randn(B, T, V, generator=g, dtype=F64)).to(dtype).requires_grad_()
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=dtype)
    lp = z.log_softmax(-1)
    mine = _triton().ctc_nll(lp.to(device), targets, input_lens, target_lens, blank).cpu()
    want = F.ctc_loss(lp.transpose(0, 1), targets, input_lens, target_lens, blank, "none")
    tol = {"rtol": 1e-10, "atol": 1e-10} if dtype == F64 else {"rtol": 1e-4, "atol": 1e-4}
    assert torch.allclose(mine, want, **tol)
    (got,) = torch.autograd.grad((mine * weights).sum(), z, retain_graph=True)
    (expected,) = torch.autograd.grad((want * weights).sum(), z)
    assert torch.allclose(got, expected, **tol)
    assert not got[2, 31:].any() and not got[0, 5:].any()  # padded frames


def test_ctc_nll_takes_the_kernels_in_a_graph_step_only(monkeypatch):
    """``ctc_nll`` runs torch's ``ctc_loss`` but in a CUDA graph's step on the triton backend."""
    taken = []
    kernels = _triton().ctc_nll
    monkeypatch.setattr(_triton(), "ctc_nll", lambda *a: taken.append(1) or kernels(*a))
    lp = torch.randn(2, 6, 4, dtype=F64).log_softmax(-1)
    args = (lp, torch.tensor([[1, 2], [3, 0]]), torch.tensor([6, 4]), torch.tensor([2, 1]))
    with use_backend("triton"):
        plain = ctc_nll(*args)
        assert not taken
        with graph_step():
            kernel = ctc_nll(*args)
        after = ctc_nll(*args)  # out of the step: torch's again
    assert taken == [1] and torch.allclose(kernel, plain, rtol=1e-12)
    assert torch.equal(after, plain)
