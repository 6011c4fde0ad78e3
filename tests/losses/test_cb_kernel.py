"""The compiled CB lattice and its arithmetic: ``exp64`` and ``log_add_exp64`` against the C
library, and the lattice against the PyTorch recursion on batches beyond enumeration's reach
(the enumeration oracles run both ways in test_conditional_bernoulli.py)."""

import math

import numba
import numpy as np
import pytest
import torch

from cbasr._backends import use_backend
from cbasr._compiled import exp32, exp64, log1p64, log_add_exp64
from cbasr.losses import cb_marginal_nll, cb_posteriors

EPS = np.finfo(np.float64).eps


def _ufunc(scalar):
    return np.vectorize(scalar, otypes=[np.float64])


def test_exp64_is_within_two_ulps_of_the_c_library():
    rng = np.random.default_rng(0)
    t = np.concatenate(
        [rng.uniform(-708, 709, 200_000), rng.uniform(-1, 1, 100_000), [0.0, -708.0, 709.0]]
    )
    got = _ufunc(exp64)(t)
    want = np.exp(t)
    assert np.max(np.abs(got - want) / want) <= 2 * EPS


@numba.njit
def _exp32_loop(t):
    out = np.empty_like(t)
    for i in range(t.shape[0]):
        out[i] = exp32(t[i])
    return out


def test_exp32_is_within_two_float32_ulps_and_stays_in_float32():
    rng = np.random.default_rng(3)
    t = rng.uniform(-87, 88, 200_000).astype(np.float32)
    got = _exp32_loop(t)  # as the kernels call it: float32 in a compiled loop
    assert got.dtype == np.float32
    want = np.exp(t.astype(np.float64))
    assert np.max(np.abs(got - want) / want) <= 2 * np.finfo(np.float32).eps
    edges = _exp32_loop(np.array([-math.inf, -87.5, math.nan, 0.0], dtype=np.float32))
    assert edges[0] == 0.0 and edges[1] == 0.0  # below -87: 0, never a subnormal
    assert math.isnan(edges[2]) and edges[3] == 1.0


def test_exp64_edges():
    assert exp64(-math.inf) == 0.0
    assert exp64(-708.5) == 0.0  # below -708: 0, never a subnormal
    assert exp64(-708.0) > 0.0
    assert math.isnan(exp64(math.nan))
    assert exp64(0.0) == 1.0


def test_log1p64_is_within_two_ulps_of_the_c_library_on_its_domain():
    rng = np.random.default_rng(2)
    u = np.concatenate([rng.uniform(0, 1, 200_000), 10.0 ** rng.uniform(-300, 0, 100_000)])
    u = np.concatenate([u, [0.0, 1.0, math.sqrt(2) - 1, np.nextafter(math.sqrt(2) - 1, 1)]])
    got = _ufunc(log1p64)(u)
    want = np.log1p(u)
    nonzero = want > 0
    assert np.all(got[~nonzero] == 0.0)
    assert np.max(np.abs(got - want)[nonzero] / want[nonzero]) <= 2 * EPS


def test_log_add_exp64_is_accurate_to_its_condition():
    rng = np.random.default_rng(1)
    x = rng.uniform(-60, 60, 300_000)
    y = x + rng.uniform(-1, 1, x.size) * rng.uniform(0, 40, x.size) ** 2  # gaps up to 1600
    got = _ufunc(log_add_exp64)(x, y)
    want = np.logaddexp(x, y)
    # m + log1p(exp(d)): the sum rounds to within eps of |m| + log1p(...); allow a few eps.
    scale = np.maximum(x, y).__abs__() + np.log1p(np.exp(-np.abs(x - y)))
    assert np.max(np.abs(got - want) / scale) <= 4 * EPS


def test_log_add_exp64_infinities():
    assert log_add_exp64(-math.inf, -math.inf) == -math.inf
    assert log_add_exp64(-math.inf, 1.5) == 1.5
    assert log_add_exp64(2.5, -math.inf) == 2.5
    assert log_add_exp64(0.0, 0.0) == pytest.approx(math.log(2.0), rel=1e-15)


def _ragged(seed, B, T, L, dtype):
    """Random lengths (some ``L_b > T_b``: no alignment, some ``L_b = 0``), NaN in the
    padding, and ``-inf`` label log-probabilities here and there."""
    g = torch.Generator().manual_seed(seed)
    il = torch.randint(0, T + 1, (B,), generator=g)
    il[0] = T
    tl = torch.minimum(torch.randint(0, L + 1, (B,), generator=g), il)
    tl[1] = 0
    il[-1], tl[-1] = 5, 6  # no alignment
    a = 3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lp = (-4 * torch.rand(B, T, L, generator=g, dtype=torch.float64)).masked_fill(
        torch.rand(B, T, L, generator=g) < 0.05, -math.inf
    )
    frames = torch.arange(T)[None, :] >= il[:, None]
    a = a.masked_fill(frames, math.nan)
    lp = lp.masked_fill(frames[:, :, None], math.nan)
    lp = lp.masked_fill((torch.arange(L)[None, :] >= tl[:, None])[:, None, :], math.nan)
    return a.to(dtype), lp.to(dtype), il, tl


def _loss_and_gradients(a, lp, il, tl, kernels):
    a = a.detach().requires_grad_()
    lp = lp.detach().requires_grad_()
    with use_backend("numba" if kernels else "torch"):
        nll = cb_marginal_nll(a, lp, il, tl, impossible="inf")
        weights = torch.linspace(0.5, 2.0, len(nll), dtype=nll.dtype)
        loss = torch.where(nll.isfinite(), nll, 0.0) @ weights
        ga, glp = torch.autograd.grad(loss, (a, lp))
        post = cb_posteriors(a, lp, il, tl)
    return nll.detach(), ga, glp, post


@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_matches_the_pytorch_recursion_float64(seed):
    a, lp, il, tl = _ragged(seed, B=12, T=60, L=25, dtype=torch.float64)
    got = _loss_and_gradients(a, lp, il, tl, kernels=True)
    want = _loss_and_gradients(a, lp, il, tl, kernels=False)
    assert got[0].isinf().any() and got[0].isfinite().any()
    for x, y in zip(got, want, strict=True):
        assert x.dtype == y.dtype
        torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-11)


def test_kernel_matches_the_pytorch_recursion_float32_long():
    """float32 in, float64 inside: at least as close to the float64 answer as the PyTorch
    float32 recursion."""
    a, lp, il, tl = _ragged(3, B=4, T=800, L=150, dtype=torch.float64)
    il[:], tl[:] = 800, torch.tensor([150, 90, 0, 150])
    lp = torch.nan_to_num(lp, nan=-2.0).clamp(min=-30.0)
    a = torch.nan_to_num(a, nan=0.0)
    exact = _loss_and_gradients(a, lp, il, tl, kernels=False)
    a32, lp32 = a.float(), lp.float()
    got = _loss_and_gradients(a32, lp32, il, tl, kernels=True)
    old = _loss_and_gradients(a32, lp32, il, tl, kernels=False)
    for x, y, z in zip(got, old, exact, strict=True):
        assert x.dtype == torch.float32
        err_kernel = ((x.double() - z) / z.abs().clamp(min=1)).abs().max()
        err_pytorch = ((y.double() - z) / z.abs().clamp(min=1)).abs().max()
        assert err_kernel <= max(err_pytorch, 1e-6)


def test_kernel_without_gradients_gives_the_same_loss():
    a, lp, il, tl = _ragged(4, B=6, T=30, L=12, dtype=torch.float64)
    with use_backend("numba"), torch.no_grad():
        plain = cb_marginal_nll(a, lp, il, tl, impossible="inf")
    with_grad = _loss_and_gradients(a, lp, il, tl, kernels=True)[0]
    torch.testing.assert_close(plain, with_grad, rtol=0, atol=0)


def test_kernel_gradients_scale_with_the_incoming_gradient():
    a, lp, il, tl = _ragged(5, B=5, T=20, L=8, dtype=torch.float64)
    tl = torch.minimum(tl, il)
    a = torch.nan_to_num(a).requires_grad_()
    lp = torch.nan_to_num(lp).requires_grad_()
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0], dtype=torch.float64)
    with use_backend("numba"):
        ga, glp = torch.autograd.grad(cb_marginal_nll(a, lp, il, tl) @ weights, (a, lp))
    with use_backend("torch"):
        wa, wlp = torch.autograd.grad(cb_marginal_nll(a, lp, il, tl) @ weights, (a, lp))
    torch.testing.assert_close(ga, wa, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(glp, wlp, rtol=1e-11, atol=1e-12)
