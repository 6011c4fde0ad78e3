"""The compiled transducer lattice against the PyTorch recursion on ragged batches beyond
enumeration's reach (the enumeration and torchaudio oracles run both ways in
test_transducer.py and test_hat.py)."""

import math

import pytest
import torch

from cbasr import _backends
from cbasr._backends import use_backend
from cbasr.losses import transducer_lattice_nll


def _ragged(seed, B, T, U, dtype):
    """Random lengths, NaN in the padding, a few ``-inf`` weights (one utterance has none
    but ``-inf`` emissions: no path)."""
    g = torch.Generator().manual_seed(seed)
    il = torch.randint(1, T + 1, (B,), generator=g)
    il[0] = T
    tl = torch.randint(0, U + 1, (B,), generator=g)
    tl[0], tl[1] = U, 0  # every label, and none
    blank = torch.randn(B, T, U + 1, generator=g, dtype=torch.float64).sigmoid().log()
    emit = -3 * torch.rand(B, T, U, generator=g, dtype=torch.float64)
    emit = emit.masked_fill(torch.rand(B, T, U, generator=g) < 0.05, -math.inf)
    tl[-1] = max(int(tl[-1]), 1)
    emit[-1] = -math.inf
    frames = (torch.arange(T)[None, :] >= il[:, None])[:, :, None]
    blank = blank.masked_fill(frames, math.nan)
    emit = emit.masked_fill(
        frames | (torch.arange(U)[None, None, :] >= tl[:, None, None]), math.nan
    )
    return blank.to(dtype), emit.to(dtype), il, tl


def _loss_and_gradients(blank, emit, il, tl, kernels):
    blank = blank.detach().requires_grad_()
    emit = emit.detach().requires_grad_()
    with use_backend("numba" if kernels else "torch"):
        nll = transducer_lattice_nll(blank, emit, il, tl)
    weights = torch.linspace(0.5, 2.0, len(nll), dtype=nll.dtype)
    loss = torch.where(nll.isfinite(), nll, 0.0) @ weights
    return (nll.detach(), *torch.autograd.grad(loss, (blank, emit)))


@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_matches_the_pytorch_recursion_float64(seed):
    blank, emit, il, tl = _ragged(seed, B=9, T=40, U=15, dtype=torch.float64)
    got = _loss_and_gradients(blank, emit, il, tl, kernels=True)
    want = _loss_and_gradients(blank, emit, il, tl, kernels=False)
    assert got[0].isinf().any() and got[0].isfinite().any()
    for x, y in zip(got, want, strict=True):
        assert x.dtype == y.dtype
        torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-11)


def test_kernel_float32_is_at_least_as_close_to_float64_as_the_pytorch_recursion():
    blank, emit, il, tl = _ragged(2, B=4, T=300, U=60, dtype=torch.float64)
    exact = _loss_and_gradients(blank, emit, il, tl, kernels=False)
    got = _loss_and_gradients(blank.float(), emit.float(), il, tl, kernels=True)
    old = _loss_and_gradients(blank.float(), emit.float(), il, tl, kernels=False)
    for x, y, z in zip(got, old, exact, strict=True):
        assert x.dtype == torch.float32
        finite = z.isfinite()
        err_kernel = ((x.double() - z) / z.abs().clamp(min=1))[finite].abs().max()
        err_pytorch = ((y.double() - z) / z.abs().clamp(min=1))[finite].abs().max()
        assert err_kernel <= max(err_pytorch, 1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_gather_logsumexp_kernel_matches_the_pytorch_blocks(threads):
    """Rows split across threads (as in training), a normaliser that skips the blank unit,
    ``-inf`` scores, an all ``-inf`` row (both paths floor its exponents: a finite, very
    negative normaliser), NaN rows of weight 0 (padding: gradient exactly 0), weights of
    either sign; float32 and float64."""
    from cbasr.losses import gather_logsumexp

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype in (torch.float32, torch.float64):
            g = torch.Generator().manual_seed(9)
            x = 4 * torch.randn(3, 300, 5, 41, generator=g, dtype=dtype)
            x = x.masked_fill(torch.rand(x.shape, generator=g) < 0.1, -math.inf)
            x[0, 0, 0, 1:] = -math.inf
            x[2, 7:] = math.nan
            index = torch.randint(0, 41, (3, 300, 5, 2), generator=g)
            weight = torch.rand(3, 300, 5, generator=g, dtype=dtype) - 0.2
            weight[2, 7:] = 0.0
            weight[0, 0, 0] = 0.0
            results = []
            for kernels in (True, False):
                leaf = x.clone().requires_grad_()
                with use_backend("numba" if kernels else "torch"):
                    picked, lse = gather_logsumexp(leaf, index, 1)
                    loss = torch.where(weight != 0, lse * weight, 0.0).sum() + picked[:, :7].sum()
                    (grad,) = torch.autograd.grad(loss, leaf)
                results.append((picked.detach(), lse.detach(), grad))
            assert -800 < results[0][1][0, 0, 0] < -80
            assert (results[0][2][2, 7:] == 0).all()
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            for got, want in zip(results[0], results[1], strict=True):
                torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
    finally:
        torch.set_num_threads(before)


@pytest.mark.triton
@pytest.mark.parametrize(
    "dtype, columns", [(torch.float32, 41), (torch.float64, 41), (torch.float32, 1500)]
)
def test_gather_logsumexp_triton_matches_the_pytorch_blocks(dtype, columns, device):
    """The Triton row passes against the PyTorch blocks: a normaliser that skips the blank
    unit, ``-inf`` scores, an all ``-inf`` row (floored as the other backends: finite), NaN rows
    of weight 0 (gradient exactly 0), weights of either sign, rows read from a wider tensor
    (row stride beyond ``V``), rows wider than one tile (1500 columns: the running maximum
    rescales the sum, also after an all ``-inf`` tile), and maxima far below 0 (the rescaling
    must not overflow)."""
    from cbasr.losses import gather_logsumexp
    from cbasr.losses._joint import _row_backend

    g = torch.Generator().manual_seed(9)
    wide = 4 * torch.randn(2, 20, 3, columns + 7, generator=g, dtype=dtype)
    wide[..., :columns] = wide[..., :columns].masked_fill(
        torch.rand(2, 20, 3, columns, generator=g) < 0.1, -math.inf
    )
    wide[0, 0, 0, 1:] = -math.inf
    wide[1, 0, 0, :] = torch.linspace(-30, 30, columns + 7, dtype=dtype)  # growing maxima
    wide[1, 1, 0] = -math.inf  # (with 1500 columns the first tile is all -inf, then ...)
    wide[1, 1, 0, columns - 20 : columns] = -85.0  # (... maxima far below 0)
    wide[1, 2, 0] = -100.0
    wide[1, 2, 0, 5] = -95.0
    wide[1, 7:] = math.nan
    index = torch.randint(0, columns, (2, 20, 3, 2), generator=g)
    weight = torch.rand(2, 20, 3, generator=g, dtype=dtype) - 0.2
    weight[1, 7:] = 0.0
    weight[0, 0, 0] = 0.0
    wide, index, weight = wide.to(device), index.to(device), weight.to(device)
    results = []
    for backend in ("triton", "torch"):
        leaf = wide.clone().requires_grad_()
        x = leaf[..., :columns]  # rows of stride columns + 7
        with use_backend(backend):
            assert _row_backend(x.reshape(-1, columns), 1) == backend  # the kernels run
            picked, lse = gather_logsumexp(x, index, 1)
            loss = torch.where(weight != 0, lse * weight, 0.0).sum() + picked[:, :7].sum()
            (grad,) = torch.autograd.grad(loss, leaf)
        results.append((picked.detach(), lse.detach(), grad))
    assert -800 < results[0][1][0, 0, 0] < -60
    assert (results[0][2][1, 7:] == 0).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for got, want in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("rows", [1, 0])
@pytest.mark.parametrize("backend", ["numba", pytest.param("triton", marks=pytest.mark.triton)])
def test_gather_logsumexp_on_a_single_row_and_on_none(backend, rows, device):
    """A joint of one row (one frame, one label position) and of none, at the edges of the
    kernels' row counts, against the PyTorch blocks: values and gradient."""
    from cbasr.losses import gather_logsumexp
    from cbasr.losses._joint import _row_backend

    if backend == "numba" and device.type != "cpu":
        pytest.skip("the compiled loops serve CPU tensors")
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(rows, 1, 1, 9, generator=g, dtype=torch.float64).to(device)
    index = torch.randint(0, 9, (rows, 1, 1, 2), generator=g).to(device)
    weight = torch.rand(rows, 1, 1, generator=g, dtype=torch.float64).to(device) + 0.5
    results = []
    for which in (backend, "torch"):
        leaf = scores.clone().requires_grad_()
        with use_backend(which):
            assert _row_backend(leaf.reshape(-1, 9), 1) == which  # the kernels run
            picked, lse = gather_logsumexp(leaf, index, 1)
            (grad,) = torch.autograd.grad((lse * weight).sum() + picked.sum(), leaf)
        results.append((picked.detach(), lse.detach(), grad))
    assert results[1][1].shape == (rows, 1, 1)
    for got, want in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.triton
def test_gather_logsumexp_triton_reads_half_precision_into_float32(device):
    """Half-precision scores: picked entries and normalisers in float32, as the PyTorch blocks
    give them, and the gradient in half precision."""
    from cbasr.losses import gather_logsumexp
    from cbasr.losses._joint import _row_backend

    g = torch.Generator().manual_seed(4)
    x = 3 * torch.randn(2, 6, 4, 33, generator=g)
    x[0, 0, 0] = -100.0  # a row's maximum far below 0
    x[0, 0, 0, 3] = -95.0
    x = x.half().to(device)
    index = torch.randint(0, 33, (2, 6, 4, 2), generator=g).to(device)
    results = []
    for backend in ("triton", "torch"):
        leaf = x.clone().requires_grad_()
        with use_backend(backend):
            assert _row_backend(leaf.view(-1, 33), 0) == backend
            picked, lse = gather_logsumexp(leaf, index)
            (grad,) = torch.autograd.grad(lse.sum() - picked.sum(), leaf)
        assert picked.dtype == lse.dtype == torch.float32 and grad.dtype == torch.float16
        results.append((picked.detach(), lse.detach(), grad))
    for got, want in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("monotonic", [False, True])
@pytest.mark.parametrize("backend", ["numba", pytest.param("triton", marks=pytest.mark.triton)])
def test_a_nan_in_a_dead_end_stays_there(backend, monotonic, device):
    """T = 2, U = 1, one label: the blank edge (1, 0) -> (2, 0) ends in a node of row T that no
    complete path leaves (no label edge runs along row T), so its NaN weight must not reach
    log P(y), which is then what the rest of the lattice gives. (The PyTorch recursion gives NaN
    here: the compiled backends follow edges only.)"""
    where = device if backend == "triton" else "cpu"  # (numba: the CPU's loops)
    blank = torch.full((1, 2, 2), -0.7, dtype=torch.float64, device=where)
    emit = torch.full((1, 2, 1), -0.7, dtype=torch.float64, device=where)
    blank[0, 1, 0] = math.nan
    clean = blank.clone()
    clean[0, 1, 0] = -math.inf  # the edge taken away
    lengths, labels = torch.tensor([2], device=where), torch.tensor([1], device=where)
    with use_backend(backend):
        assert _backends.backend(blank) == backend  # (triton on CPU tensors: interpreted)
        nll = transducer_lattice_nll(blank, emit, lengths, labels, monotonic=monotonic)
        expected = transducer_lattice_nll(clean, emit, lengths, labels, monotonic=monotonic)
    assert torch.isfinite(expected).all()
    torch.testing.assert_close(nll.cpu(), expected.cpu(), rtol=0, atol=1e-12)
