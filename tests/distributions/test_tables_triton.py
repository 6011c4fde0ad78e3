"""The Triton kernels of the count recursion (:mod:`cbasr.distributions._tables_triton`)
against the PyTorch recursion and the closed forms: on CPU in Triton's interpreter, on a GPU
with ``--device cuda``."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from cbasr._backends import triton_interpreted, use_backend
from cbasr.distributions import ConditionalBernoulli, PoissonBinomial, id_checking_sample
from cbasr.distributions._arguments import frame_mask
from cbasr.distributions._tables import (
    bernoulli_log_weights,
    count_table,
    gather_states,
    tilt_for_total,
)
from tests.distributions.cases import extreme_logits, random_logits

pytestmark = pytest.mark.triton

# Rows: padding, totals 0 / full / in between, no frames, forced frames, an impossible total.
LENGTHS = torch.tensor([9, 5, 9, 0, 7, 9, 3])
TOTALS = torch.tensor([4, 5, 0, 0, 3, 2, 4])  # the last row: 4 highs in 3 frames


@pytest.fixture(autouse=True)
def recursion():
    """One run per test (the package's conftest runs each test under two CPU backends): the
    tests here choose the backend of each call themselves."""
    yield "triton"


def _logits(dtype=torch.float64) -> torch.Tensor:
    logits = random_logits(len(LENGTHS), 9, seed=5, dtype=dtype)
    logits[4, 1], logits[4, 5] = math.inf, -math.inf
    logits[5, :3] = -math.inf
    return logits


def _log_prob_and_gradient(logits, backend: str, device):
    """``log P(b | k)`` of a fixed draw (the impossible row: zeros, ``-inf``) and the gradient
    of a weighted sum of the finite ones."""
    gen = torch.Generator().manual_seed(1)
    value = id_checking_sample(logits[:-1], TOTALS[:-1], LENGTHS[:-1], (), gen)
    value = torch.cat([value, value.new_zeros(1, value.shape[-1])])
    x = logits.detach().to(device).requires_grad_()
    with use_backend(backend):
        cb = ConditionalBernoulli(x, TOTALS.to(device), LENGTHS.to(device), validate_args=False)
        log_prob = cb.log_prob(value.to(device))
    weights = torch.linspace(0.5, 2.0, len(LENGTHS), dtype=logits.dtype, device=device)
    finite = torch.where(log_prob.isfinite(), log_prob, 0.0)
    (grad,) = torch.autograd.grad(finite @ weights, x)
    return log_prob.detach().cpu(), grad.cpu()


def test_log_prob_and_its_gradient_equal_the_pytorch_recursion(device):
    logits = _logits()
    got, got_grad = _log_prob_and_gradient(logits, "triton", device)
    want, want_grad = _log_prob_and_gradient(logits, "torch", "cpu")
    assert got[-1] == -math.inf and want[-1] == -math.inf
    assert got[:-1].isfinite().all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-12)
    assert (got_grad[-1] == 0).all()  # the impossible row gets no gradient
    assert (got_grad[1, 5:] == 0).all()  # nor does padding


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_normaliser_equals_the_prefix_table_at_the_same_tilt(dtype, device):
    """The kernel's ``log P(K = k)`` against the PyTorch prefix table, given the same tilted
    weights; its gradient against autograd through that table (eq. 16)."""
    from cbasr.distributions._tables_triton import LogNormaliser

    logits = _logits(dtype)
    valid = frame_mask(LENGTHS, logits.shape[-1])
    tilt = tilt_for_total(logits, TOTALS, valid)
    log_off, log_on = bernoulli_log_weights(logits, valid, tilt)
    log_off, log_on = log_off.requires_grad_(), log_on.requires_grad_()
    table = count_table(log_off, log_on, 10)[-1]
    want = gather_states(table, TOTALS.clamp(max=9).unsqueeze(-1)).squeeze(-1)
    off, on = log_off.detach().to(device).requires_grad_(), log_on.detach().to(device)
    on.requires_grad_()
    got = LogNormaliser.apply(off, on, TOTALS.to(device), LENGTHS.to(device), 10)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(got.cpu()[:-1], want[:-1], **tol)
    assert got[-1] == -math.inf  # more highs than frames
    weights = torch.linspace(0.5, 2.0, len(LENGTHS) - 1, dtype=dtype)
    want_grads = torch.autograd.grad(want[:-1] @ weights, (log_off, log_on))
    got_grads = torch.autograd.grad(got[:-1] @ weights.to(device), (off, on))
    for g, w in zip(got_grads, want_grads):  # padding frames are not read: no gradient
        torch.testing.assert_close(g.cpu(), torch.where(valid, w, 0.0), **tol)


def test_tilt_is_the_bisection_of_the_reference(device):
    """Rows with padding, no frames, infinite logits, and long extreme ones."""
    from cbasr.distributions._tables_triton import tilt

    logits = torch.cat([_logits()[:, :9].repeat(1, 6)[:, :50], extreme_logits(3, 50).double()])
    total = torch.tensor([4, 5, 0, 0, 3, 2, 4, 25, 1, 49])
    lengths = torch.tensor([50, 5, 40, 0, 7, 50, 3, 50, 50, 50])
    want = tilt_for_total(logits, total, frame_mask(lengths, 50))
    got = tilt(logits.to(device), total.to(device), lengths.to(device))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-9, atol=1e-9)


def test_float32_log_prob_is_accurate_on_long_extreme_sequences(device):
    """B = 4, T = 200, k up to 100, logits with +-30 entries: float32 in, float64 reference."""
    logits = extreme_logits(4, 200, seed=3)
    total = torch.tensor([50, 20, 100, 1])
    value = ConditionalBernoulli(logits.double(), total).sample(
        generator=torch.Generator().manual_seed(0)
    )
    with use_backend("torch"):
        want = ConditionalBernoulli(logits.double(), total).log_prob(value)
    with use_backend("triton"):
        cb = ConditionalBernoulli(logits.to(device), total.to(device))
        got = cb.log_prob(value.float().to(device)).cpu()
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-4)


def test_double_backward_equals_the_pytorch_recursion(device):
    """The gradient with a graph (``create_graph``) and its own gradient, against the PyTorch
    backend's (gradgradcheck holds that one; it is too slow for the interpreter)."""
    value = torch.tensor([[1.0, 0, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.float64)
    logits = random_logits(2, 6, seed=2)
    total, lengths = torch.tensor([3, 1]), torch.tensor([6, 4])
    direction = torch.linspace(-1.0, 1.0, 12, dtype=torch.float64).view(2, 6)
    results = {}
    for backend, where in (("triton", device), ("torch", "cpu")):
        x = logits.to(where).requires_grad_()
        with use_backend(backend):
            log_prob = ConditionalBernoulli(x, total.to(where), lengths.to(where)).log_prob(
                value.to(where)
            )
        (grad,) = torch.autograd.grad(log_prob.sum(), x, create_graph=True)
        (hessian_direction,) = torch.autograd.grad((grad * direction.to(where)).sum(), x)
        results[backend] = (grad.detach().cpu(), hessian_direction.cpu())
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert results["torch"][1].abs().sum() > 0


def test_poisson_binomial_tails_by_the_tilted_kernel(device):
    """``log P(K = k)`` one count per row, far into both tails, against the closed forms, and
    in between against the PyTorch table; with its gradient."""
    logits = random_logits(4, 150, seed=9)
    lengths = torch.tensor([150, 150, 100, 150])
    count = torch.tensor([150, 0, 100, 60])
    x = logits.to(device).requires_grad_()
    with use_backend("triton"):
        got = PoissonBinomial(x, lengths.to(device)).log_prob(count.to(device))
    valid = frame_mask(lengths, 150)
    every = torch.where(valid, F.logsigmoid(logits), 0.0).sum(-1)
    none = torch.where(valid, F.logsigmoid(-logits), 0.0).sum(-1)
    torch.testing.assert_close(got.detach().cpu()[[0, 2]], every[[0, 2]], rtol=1e-12, atol=0)
    torch.testing.assert_close(got.detach().cpu()[1], none[1], rtol=1e-12, atol=0)
    y = logits.clone().requires_grad_()
    with use_backend("torch"):
        want = PoissonBinomial(y, lengths).log_prob(count)
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-12, atol=0)
    (got_grad,) = torch.autograd.grad(got.sum(), x)
    (want_grad,) = torch.autograd.grad(want.sum(), y)
    torch.testing.assert_close(got_grad.cpu(), want_grad, rtol=1e-9, atol=1e-12)


def _draw_inputs(width: str, dtype=torch.float64):
    """The possible rows of ``_logits``, their tilt, 3 samples per row and their uniforms."""
    from cbasr.distributions._dispatch import tilt_for_total as dispatched_tilt

    logits = _logits(dtype)[:-1]
    total, lengths = TOTALS[:-1], LENGTHS[:-1]
    with use_backend("numba"):
        tilt = dispatched_tilt(logits, total, frame_mask(lengths, logits.shape[-1]))
    row_index = torch.arange(3 * len(total)) % len(total)
    columns = logits.shape[-1] if width == "frames" else int(total.max())
    uniform = torch.rand(len(row_index), columns, generator=torch.Generator().manual_seed(4))
    return logits, tilt, total, lengths, row_index, uniform.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("sampler", ["id_checking", "bounded"])
def test_draws_equal_the_compiled_kernels_given_the_same_uniforms(sampler, dtype, device):
    """Rows with padding, no frames, totals 0 and full, forced highs and lows; the compiled
    CPU kernels (tested against eq. 16 and the PyTorch loop) as the oracle."""
    from cbasr.distributions import _kernels, _tables_triton

    inputs = _draw_inputs("frames" if sampler == "id_checking" else "highs", dtype)
    want, want_possible = getattr(_kernels, sampler)(*inputs)
    logits, tilt, total, lengths, _, uniform = (x.to(device) for x in inputs)
    sized = (int(total.max()) + 1,) if sampler == "id_checking" else ()  # (bounded: uniform's K)
    got, got_possible = getattr(_tables_triton, sampler)(
        logits, tilt, total, lengths, uniform, *sized
    )
    if sampler == "id_checking":  # 0. / 1. in the logits' dtype
        assert got.dtype == dtype and ((got == 0) | (got == 1)).all()
        got = got.bool()
    assert torch.equal(got.cpu(), want) and got.dtype == want.dtype
    assert bool(got_possible.all()) and bool(want_possible.all())
    logits, _, total, lengths, row_index, _ = inputs
    if sampler == "id_checking":  # exactly the total, inside the frames, forced frames kept
        assert torch.equal(got.sum(-1).cpu(), total[row_index])
        assert not (got.cpu() & ~frame_mask(lengths, 9)[row_index]).any()
        assert not (got.cpu() & (logits == -math.inf)[row_index]).any()
        assert (got.cpu() | ~(logits == math.inf)[row_index]).all()


def test_samplers_dispatch_to_the_kernels_and_refuse_an_impossible_total():
    """The public samplers under the triton backend draw what the compiled kernels draw from
    the same generator (CPU tensors, in the interpreter: with ``--device cuda`` the kernels
    serve CUDA tensors only, and a CUDA generator draws other uniforms; the kernels' own
    tests above run there)."""
    from cbasr.distributions import bounded_bernoulli_sample, draft_sample

    if not triton_interpreted():
        pytest.skip("compares CPU draws: the kernels serve CPU tensors in the interpreter only")

    logits, total, lengths = _logits()[:-1], TOTALS[:-1], LENGTHS[:-1]
    for sample in (id_checking_sample, bounded_bernoulli_sample, draft_sample):
        draws = {}
        for backend in ("numba", "triton"):
            with use_backend(backend):
                gen = torch.Generator().manual_seed(7)
                draws[backend] = sample(logits, total, lengths, (2,), gen)
        assert torch.equal(draws["triton"], draws["numba"]), sample.__name__
    lows = _logits()[5:6]  # 3 of its 9 frames have a -inf logit: 7 highs cannot be met
    with use_backend("triton"), pytest.raises(ValueError, match="cannot be met"):
        id_checking_sample(lows, torch.tensor([7]), torch.tensor([9]))
    # more highs than frames: the kernels find the total impossible, and the error says why,
    # at once or at the end of a one_read block
    from cbasr.checks import one_read

    for block in (False, True):
        with use_backend("triton"), pytest.raises(ValueError, match=r"0 <= total <= lengths"):
            with one_read() if block else contextlib.nullcontext():
                id_checking_sample(_logits()[:1], torch.tensor([5]), torch.tensor([4]))


def test_a_total_outside_the_states_has_probability_zero(device):
    """``log P(K = k)`` is ``-inf`` for ``k < 0`` or past the table, as the reference's."""
    from cbasr.distributions._tables_triton import LogNormaliser

    half = torch.full((3, 3), math.log(0.5), dtype=torch.float64, device=device)
    total = torch.tensor([-1, 2, 4], device=device)
    got = LogNormaliser.apply(half, half, total, torch.tensor([3, 3, 3], device=device), 4)
    assert got[0] == -math.inf and got[2] == -math.inf  # 4 highs in 3 frames
    torch.testing.assert_close(got[1].cpu(), torch.tensor(math.log(3 / 8), dtype=torch.float64))


def _values_and_broken_rows(logits):
    """Two draws per possible row of ``logits`` ``(2, 7, 9)``, then three rows broken in the
    second draw: a high moved into padding (row 1), a high added (row 2), a 0.5 (row 4)."""
    gen = torch.Generator().manual_seed(3)
    value = id_checking_sample(logits[:-1], TOTALS[:-1], LENGTHS[:-1], (2,), gen)
    value = torch.cat([value, value.new_zeros(2, 1, value.shape[-1])], dim=1)
    broken = value.clone()
    broken[1, 1] = 0
    broken[1, 1, :4], broken[1, 1, 6] = 1, 1  # 5 highs as the total, one at t = 6 >= 5
    broken[1, 2, 0] = 1  # one high more than the total (0)
    broken[1, 4, 0] = 0.5  # not binary
    return value, broken


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_log_prob_of_samples_and_its_gradient_equal_the_pytorch_recursion(dtype, device):
    """``log_prob`` of values with a sample dimension (each parameter row's gradient a sum over
    its samples), rows outside the support among them (``-inf``, no gradient), under a weighted
    and a summed (expanded: stride 0) incoming gradient, against the PyTorch backend."""
    logits = _logits(dtype)
    _, value = _values_and_broken_rows(logits.double())
    value[1, 4, 0] = 1  # binary, but now one high too many: -inf without validation
    weights = torch.linspace(0.5, 2.0, value.shape[0] * value.shape[1], dtype=dtype).view(2, -1)
    results = {}
    for backend, where in (("triton", device), ("torch", "cpu")):
        x = logits.to(where).requires_grad_()
        with use_backend(backend):
            cb = ConditionalBernoulli(x, TOTALS.to(where), LENGTHS.to(where), validate_args=False)
            log_prob = cb.log_prob(value.to(where, dtype))
        finite = torch.where(log_prob.isfinite(), log_prob, 0.0)
        (weighted,) = torch.autograd.grad((finite * weights.to(where)).sum(), x, retain_graph=True)
        (summed,) = torch.autograd.grad(finite.sum(), x)
        results[backend] = [t.detach().cpu() for t in (log_prob, weighted, summed)]
    (got, *got_grads), (want, *want_grads) = results["triton"], results["torch"]
    assert torch.equal(got.isfinite(), want.isfinite())
    assert got[1, [1, 2, 4, 6]].eq(-math.inf).all() and got[0, :6].isfinite().all()
    tolerance = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(got, want, **tolerance)
    for got_grad, want_grad in zip(got_grads, want_grads):
        torch.testing.assert_close(got_grad, want_grad, **tolerance)
        assert (got_grad[-1] == 0).all() and (got_grad[1, 5:] == 0).all()


def test_fused_log_prob_codes_say_what_is_wrong_with_each_value(device):
    """The kernel's code per value row (3 not binary, 2 a high in padding, 1 not ``k`` highs)
    and, with validation, each error as the PyTorch backend raises it."""
    from cbasr.distributions._tables_triton import LogProb

    logits = _logits()
    good, broken = _values_and_broken_rows(logits)
    rows = broken.reshape(-1, logits.shape[-1]).to(device)
    _, codes = LogProb.apply(
        logits.to(device), TOTALS.to(device), LENGTHS.to(device), rows, 6, None
    )
    want = torch.zeros(2, len(TOTALS), dtype=torch.int8)
    want[1, 1], want[1, 2], want[1, 4] = 2, 1, 3
    want[:, -1] = 1  # the impossible row: 4 highs wanted, none given
    assert torch.equal(codes.view(2, -1).cpu(), want)
    cb = {}
    for backend, where in (("triton", device), ("torch", "cpu")):
        with use_backend(backend):
            cb[backend] = ConditionalBernoulli(
                logits[:-1].to(where), TOTALS[:-1].to(where), LENGTHS[:-1].to(where)
            )
            cb[backend].log_prob(good[:, :-1].to(where))  # no error
    for backend, where in (("triton", device), ("torch", "cpu")):  # checked before any kernel
        with use_backend(backend), pytest.raises(ValueError, match="value must have shape"):
            cb[backend].log_prob(good[:, :-1, :-1].to(where))
    for row, message in ((1, "padding"), (2, "1 highs but total is 0"), (4, "binary")):
        value = good.clone()
        value[1, row] = broken[1, row]
        for backend, where in (("triton", device), ("torch", "cpu")):
            with use_backend(backend), pytest.raises(ValueError, match=message):
                cb[backend].log_prob(value[:, :-1].to(where))


@pytest.mark.parametrize("frames", [0, 1, 2])
def test_fused_log_prob_of_short_and_empty_rows_equals_the_pytorch_recursion(frames, device):
    """No frames, one, two; and no values at all (a sample shape of 0)."""
    logits = random_logits(3, frames, seed=8)
    total = torch.tensor([0, min(1, frames), min(2, frames)])
    value = torch.zeros(2, 3, frames, dtype=torch.float64)
    value[:, 1, :1] = 1 if frames else 0
    value[:, 2, :2] = 1 if frames else 0
    value[1, 0, :1] = 1 if frames else 0  # a high too many: -inf
    results = {}
    for backend, where in (("triton", device), ("torch", "cpu")):
        x = logits.to(where).requires_grad_()
        with use_backend(backend):
            cb = ConditionalBernoulli(x, total.to(where), validate_args=False)
            log_prob = cb.log_prob(value.to(where))
            none = cb.log_prob(value[:0].to(where))
        finite = torch.where(log_prob.isfinite(), log_prob, 0.0)
        (grad,) = torch.autograd.grad(finite.sum(), x)
        assert none.shape == (0, 3)
        results[backend] = (log_prob.detach().cpu(), grad.cpu())
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert results["torch"][0].isfinite().sum() == (5 if frames else 6)


def test_fused_log_prob_fills_its_block_of_count_states(device):
    """``max(k) = 15``: 16 count states, the kernel's whole block (no spare lane past the last
    state), over 40 frames (a state that leaked into its neighbour would reach the normaliser),
    against the PyTorch recursion, with the gradient."""
    logits = random_logits(2, 40, seed=11)
    total, lengths = torch.tensor([15, 4]), torch.tensor([40, 30])
    value = id_checking_sample(logits, total, lengths, (2,), torch.Generator().manual_seed(2))
    results = {}
    for backend, where in (("triton", device), ("torch", "cpu")):
        x = logits.to(where).requires_grad_()
        with use_backend(backend):
            log_prob = ConditionalBernoulli(x, total.to(where), lengths.to(where)).log_prob(
                value.to(where)
            )
        (grad,) = torch.autograd.grad(log_prob.sum(), x)
        results[backend] = (log_prob.detach().cpu(), grad.cpu())
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _count_weights(case: str, dtype):
    """``(log_off, log_on) (B, T)`` and ``V``: the ragged rows above (padding, no frames, +-inf
    logits, more count states than a row's frames), or a full block of 16 states over 20
    frames (the highest count reachable, so the kernels' shifts meet the block's edge)."""
    if case == "ragged":
        logits, lengths, totals, V = _logits(dtype), LENGTHS, TOTALS.clamp(max=LENGTHS), 6
    else:
        logits, V = random_logits(2, 20, seed=8, dtype=dtype), 16
        lengths, totals = torch.tensor([20, 17]), torch.tensor([15, 9])
    valid = frame_mask(lengths, logits.shape[-1])
    tilt = tilt_for_total(logits, totals, valid)
    return (*bernoulli_log_weights(logits, valid, tilt), V)


@pytest.mark.parametrize("case", ["ragged", "full block"])
@pytest.mark.parametrize("suffix", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_count_table_and_its_adjoint_equal_the_pytorch_recursion(
    case, suffix, dtype, device, monkeypatch
):
    """``_dispatch.count_table`` on the triton backend (:class:`CountTable`: one program per
    row, forward and backward) against the reference's ``T`` steps, with a gradient on every
    row of the table (and none on some entries)."""
    from cbasr.distributions import _dispatch, _tables_triton

    g = torch.Generator().manual_seed(7)
    log_off, log_on, V = _count_weights(case, dtype)
    B, T = log_off.shape
    weights = torch.randn(T + 1, B, V, generator=g, dtype=dtype)
    launches = []
    apply = _tables_triton.CountTable.apply
    monkeypatch.setattr(
        _tables_triton.CountTable, "apply", lambda *a: launches.append(a[3]) or apply(*a)
    )
    results = {}
    for backend, where in (("triton", device), ("torch", "cpu")):
        off = log_off.detach().to(where).requires_grad_()
        on = log_on.detach().to(where).requires_grad_()
        with use_backend(backend):
            table = _dispatch.count_table(off, on, V, suffix=suffix)
        w = weights.to(where)
        finite = torch.where(table.isfinite(), table, 0.0)
        grads = torch.autograd.grad((finite * w).sum(), (off, on))
        results[backend] = [x.detach().cpu() for x in (table, *grads)]
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    for got, want, name in zip(results["triton"], results["torch"], ("table", "off", "on")):
        assert torch.equal(got.isneginf(), want.isneginf()), name
        torch.testing.assert_close(got, want, **tolerance, msg=name)
    assert results["torch"][2].abs().sum() > 0
    assert results["torch"][0][:, :, V - 1].isfinite().any()  # the last state is reached
    assert launches == [suffix]  # the triton backend took the kernels, the torch one did not


def test_count_table_kernels_serve_the_id_checking_log_probs(device, monkeypatch):
    """``id_checking_log_probs`` (the IDB estimator's steps, eq. 11) on the triton backend:
    its suffix table from the kernels, the reference's values and gradient."""
    from cbasr.distributions import _tables_triton, id_checking_log_probs

    launches = []
    apply = _tables_triton.CountTable.apply
    monkeypatch.setattr(
        _tables_triton.CountTable, "apply", lambda *a: launches.append(a[3]) or apply(*a)
    )
    logits = random_logits(3, 8, seed=9)
    total, lengths = torch.tensor([3, 0, 5]), torch.tensor([8, 6, 7])
    samples = id_checking_sample(logits, total, lengths, (4,), torch.Generator().manual_seed(3))
    results = {}
    for backend, where in (("triton", device), ("torch", "cpu")):
        x = logits.to(where).requires_grad_()
        with use_backend(backend):
            steps = id_checking_log_probs(x, total.to(where), samples.to(where), lengths.to(where))
        (grad,) = torch.autograd.grad(steps.sum(), x)
        results[backend] = (steps.detach().cpu(), grad.cpu())
    assert launches == [True]  # one suffix table, by the kernels
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_count_table_double_backward_runs_the_reference_adjoint(device):
    """A backward with a graph through :class:`CountTable` (the reference's differentiable
    adjoint): the gradient and its own gradient in a direction, the PyTorch backend's."""
    from cbasr.distributions import _dispatch

    log_off, log_on, V = _count_weights("ragged", torch.float64)
    direction = torch.linspace(-1.0, 1.0, log_on.numel(), dtype=torch.float64).view_as(log_on)
    results = {}
    for backend, where in (("triton", device), ("torch", "cpu")):
        on = log_on.detach().to(where).requires_grad_()  # (log_off: no gradient asked)
        with use_backend(backend):
            table = _dispatch.count_table(log_off.to(where), on, V, suffix=True)
        finite = torch.where(table.isfinite(), table, 0.0)
        (grad,) = torch.autograd.grad(finite.sum(), on, create_graph=True)
        (second,) = torch.autograd.grad((grad * direction.to(where)).sum(), on)
        results[backend] = (grad.detach().cpu(), second.cpu())
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert results["torch"][1].abs().sum() > 0


def test_prefix_and_suffix_tables_by_the_kernels(device, monkeypatch):
    """``_dispatch.prefix_and_suffix_tables`` on the triton backend: a prefix and a suffix
    launch of :class:`CountTable`, the reference's pair of tables."""
    from cbasr.distributions import _dispatch, _tables, _tables_triton

    launches = []
    apply = _tables_triton.CountTable.apply
    monkeypatch.setattr(
        _tables_triton.CountTable, "apply", lambda *a: launches.append(a[3]) or apply(*a)
    )
    log_off, log_on, V = _count_weights("ragged", torch.float64)
    with use_backend("triton"):
        got = _dispatch.prefix_and_suffix_tables(log_off.to(device), log_on.to(device), V)
    want = _tables.prefix_and_suffix_tables(log_off, log_on, V)
    assert launches == [False, True]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-12)
    with use_backend("torch"):
        _dispatch.prefix_and_suffix_tables(log_off, log_on, V)
    assert launches == [False, True]  # the reference's, not the kernels
