"""Compiled CPU kernels for the Conditional Bernoulli count recursions (package-internal).

The tables of :mod:`cbasr.distributions._tables` hold tilted Poisson-Binomial probabilities
``P(K_S = v)``, which lie in ``[0, 1]``. Here they are run in probability space, computed in
float64, so that each state update of the count recursion (Chen and Liu, 1997, Method 2; CB
paper eq. 8) is one multiply-add instead of a log-add-exp:

    prefix[t + 1, v] = (1 - p_t) prefix[t, v] + p_t prefix[t, v - 1].

Every term is non-negative, so nothing cancels. A probability below ``1e-300`` is flushed to 0
so that no subnormal arithmetic slows the loop (the tilt keeps ``P(K = k)`` of modest size, so
such a state cannot change a result); a table kept between passes is stored in the caller's
precision. The loops are compiled by numba (Lam, Pitrou and Seibert, 2015, "Numba: a
LLVM-based Python JIT compiler"), with an on-disk cache, one parameter row at a time, for CPU
tensors. CUDA tensors and double backward use the PyTorch recursion of
:mod:`cbasr.distributions._tables`, which the tests hold these kernels to (they run every
distribution test under both backends, see :func:`cbasr._backends.use_backend`). Each loop starts at a constant and
walks memory upwards: a loop from a run-time start does not vectorise, and a large table read
or written backwards row by row costs more (recipes/synth/RESULTS.md, "Measurements behind
defaults").

- :func:`tilt`: the exponential tilt of :func:`cbasr.distributions._tables.tilt_for_total`,
  by safeguarded Newton steps.
- :class:`LogNormaliser`: ``log P(K = k)`` with its adjoint, the inclusion probabilities
  ``P(B_t = 1 | k)`` of eq. (16), from the prefix table and a rolling suffix row.
- :func:`id_checking`: ID-checking draws (eq. 11) from a suffix table.
"""

import math
import threading

import numpy as np
import torch

from cbasr._compiled import jit
from cbasr.distributions._tables import normaliser_double_backward, normaliser_gradients

__all__: list[str] = []  # package-internal

_FLUSH = 1e-300  # float64 probabilities below this are set to 0 (no subnormals)
# Reassociation and contraction let the loops vectorise; not nnan/ninf: infinities are data.
_FAST = {"reassoc", "contract", "nsz", "arcp", "afn"}


def _jit(function):
    """:func:`cbasr._compiled.jit` with the fast-maths flags of these loops."""
    return jit(function, fastmath=frozenset(_FAST))


# ---- the loops ------------------------------------------------------------------------------


@_jit
def _prefix_step(a, b, p, q, top):  # pragma: no cover - compiled
    """``b[v] = q a[v] + p a[v - 1]`` for ``v <= top``: one frame of the prefix recursion,
    flushed below ``1e-300``. (Every loop here starts at a constant: one from a run-time
    start does not vectorise.)"""
    b[0] = q * a[0]
    for v in range(1, top + 1):
        x = q * a[v] + p * a[v - 1]
        b[v] = x if x > _FLUSH else 0.0


@_jit
def _suffix_step(a, b, p, q, k):  # pragma: no cover - compiled
    """``b[j] = q a[j] + p a[j + 1]`` for ``j <= k`` (``a[k + 1] = 0``): one frame of the
    suffix recursion, indexed by ``j = k - count``."""
    for j in range(k + 1):
        x = q * a[j] + p * a[j + 1]
        b[j] = x if x > _FLUSH else 0.0


@_jit
def _store(src, dst, top, floor):  # pragma: no cover - compiled
    for v in range(top + 1):
        x = src[v]
        dst[v] = x if x > floor else 0.0


@_jit
def _dot_shifted(prefix_row, suffix_row, top):  # pragma: no cover - compiled
    """``sum_{l <= top} prefix_row[l] * suffix_row[l + 1]``."""
    total = 0.0
    for v in range(top + 1):
        total += prefix_row[v] * suffix_row[v + 1]
    return total


@_jit
def _normaliser_forward(on, off, lengths, totals, prefix, floor):  # pragma: no cover
    """``P(K = k)`` per row; ``prefix[i, t, v] = P(K_{<t} = v)`` for ``v <= min(t, k)``,
    kept in the caller's precision (values below ``floor`` as 0)."""
    B = on.shape[0]
    V = prefix.shape[2]
    out = np.zeros(B)
    rows = np.zeros((2, V))
    for i in range(B):
        n, k = lengths[i], totals[i]
        if k < 0 or k > n:
            continue  # no sequence has k highs: P(K = k) = 0
        rows[0, 0] = 1.0
        prefix[i, 0, 0] = 1.0
        for t in range(n):
            a, b = rows[t % 2], rows[(t + 1) % 2]
            top = min(t + 1, k)
            if top == t + 1:
                a[top] = 0.0  # a new count: no way there yet
            _prefix_step(a, b, on[i, t], off[i, t], top)
            _store(b, prefix[i, t + 1], top, floor)
        out[i] = rows[n % 2, k]
    return out


_BLOCK = 32  # prefix rows copied at a time by the backward pass


@_jit
def _inclusion(on, off, lengths, totals, prefix, normaliser, inclusion):  # pragma: no cover
    """``inclusion[i, t] = P(B_t = 1 | k)`` (eq. 16) for frames ``< n``, from the prefix
    table and a suffix row ``s[j] = P(K_{>t} = k - j)`` rolled from the last frame back.

    The frames run backwards but the table is read forwards, a block of rows at a time:
    reading a large table backwards row by row costs more (module docstring; here as in the
    suffix table's layout below, the hardware prefetches ascending addresses best)."""
    B = on.shape[0]
    V = prefix.shape[2]
    rows = np.zeros((2, V + 1))
    block = np.empty((_BLOCK, V))
    for i in range(B):
        n, k = lengths[i], totals[i]
        if normaliser[i] == 0.0:
            continue  # an impossible total: no gradient
        rows[:] = 0.0
        rows[0, k] = 1.0  # no frames after the last: count 0, j = k
        for end in range(n, 0, -_BLOCK):
            start = max(0, end - _BLOCK)
            for t in range(start, end):
                _store(prefix[i, t], block[t - start], min(t, k - 1), 0.0)
            for t in range(end - 1, start - 1, -1):
                a, b = rows[(n - 1 - t) % 2], rows[(n - t) % 2]
                # eqs. (15)-(16): sum_l P(K_{<t} = l) p_t P(K_{>t} = k - 1 - l) / P(K = k)
                top = min(t, k - 1)
                if top >= 0:
                    share = _dot_shifted(block[t - start], a, top)
                    inclusion[i, t] = on[i, t] * share / normaliser[i]
                _suffix_step(a, b, on[i, t], off[i, t], k)


@_jit
def _suffix_table(on, off, lengths, totals, suffix, floor):  # pragma: no cover
    """``suffix[i, s, j] = P(K_{>=n-s} = k - j)``: the last ``s`` frames, ``s <= n``, ``j <=
    k`` (below ``floor``: 0). Rows run from the end of the sequence so that they are written
    at ascending addresses."""
    B = on.shape[0]
    V = suffix.shape[2]
    rows = np.zeros((2, V + 1))
    for i in range(B):
        n, k = lengths[i], totals[i]
        rows[:] = 0.0
        rows[0, k] = 1.0  # the empty suffix: count 0, j = k
        _store(rows[0], suffix[i, 0], k, floor)
        for s in range(1, n + 1):
            a, b = rows[(s - 1) % 2], rows[s % 2]
            _suffix_step(a, b, on[i, n - s], off[i, n - s], k)
            _store(b, suffix[i, s], k, floor)


@_jit
def _id_checking_draws(on, off, lengths, totals, suffix, rows, uniform, out):  # pragma: no cover
    """ID-checking (eq. 11): at frame ``t`` with ``r`` highs to place, high with probability
    ``p_t P(K_{>t} = r - 1) / P(K_{>=t} = r)``, i.e. when ``u`` exceeds the low share."""
    N, T = uniform.shape
    for m in range(N):
        i = rows[m]
        n, r = lengths[i], totals[i]
        k = r
        for t in range(n):
            if r == 0:
                break
            after = suffix[i, n - t - 1]  # the frames after t
            # P(K_{>t} = r) and P(K_{>t} = r - 1), at j = k - count
            low = off[i, t] * after[k - r]
            high = on[i, t] * after[k - r + 1]
            if uniform[m, t] * (low + high) > low:
                out[m, t] = True
                r -= 1


@_jit
def _bounded_draws(on, off, lengths, totals, suffix, rows, uniform, out):  # pragma: no cover
    """Bounded Bernoulli steps (eq. 13) by inversion: with the previous high before frame
    ``t`` and ``r`` highs to place, the next one is at ``u >= t`` with probability
    ``prod_{t <= v < u} (1 - p_v) p_u P(K_{>u} = r - 1) / P(K_{>=t} = r)``; the frames are
    walked from ``t`` until the running sum exceeds ``U P(K_{>=t} = r)``. Every step starts
    where the last one stopped, so a sample costs O(T)."""
    N = uniform.shape[0]
    for m in range(N):
        i = rows[m]
        n, k = lengths[i], totals[i]
        t = 0
        for step in range(k):
            r = k - step
            last = n - r  # the latest frame that leaves r - 1 frames after it
            target = uniform[m, step] * suffix[i, n - t, k - r]
            running, skipped, chosen = 0.0, 1.0, last
            for u in range(t, last + 1):
                running += skipped * on[i, u] * suffix[i, n - u - 1, k - r + 1]
                if running > target:
                    chosen = u
                    break
                skipped *= off[i, u]
            out[m, step] = chosen
            t = chosen + 1


@_jit
def _probabilities(logits, tilts, lengths, on, off):  # pragma: no cover - compiled
    """``p_t = sigmoid(x_t - lambda)`` and ``1 - p_t``, each without cancellation."""
    B = logits.shape[0]
    for i in range(B):
        for t in range(lengths[i]):
            z = logits[i, t] - tilts[i]
            e = math.exp(-abs(z))  # 0 for an infinite logit
            share = 1.0 / (1.0 + e)
            if z >= 0:
                on[i, t], off[i, t] = share, e * share
            else:
                on[i, t], off[i, t] = e * share, share


@_jit
def _tilts(logits, lengths, totals, out):  # pragma: no cover - compiled
    """Per row, ``lambda`` with ``sum_t sigmoid(x_t - lambda) = target`` by Newton steps kept
    inside a bisection bracket (the mean is decreasing in ``lambda``)."""
    B, T = logits.shape
    for i in range(B):
        n = lengths[i]
        count, always = 0, 0
        low, high, mean = math.inf, -math.inf, 0.0
        for t in range(n):
            x = logits[i, t]
            if math.isinf(x):
                if x > 0:
                    always += 1
            else:
                count += 1
                low, high, mean = min(low, x), max(high, x), mean + x
        if count == 0:
            out[i] = 0.0
            continue
        target = min(max(totals[i] - always, 0.5), count - 0.5)
        low, high = low - 40.0, high + 40.0
        fraction = target / count
        lam = min(max(mean / count - math.log(fraction / (1.0 - fraction)), low), high)
        for _ in range(200):
            excess, slope = -target, 0.0
            for t in range(n):
                x = logits[i, t]
                if not math.isinf(x):
                    z = x - lam
                    e = math.exp(-abs(z))
                    s = 1.0 / (1.0 + e) if z >= 0 else e / (1.0 + e)
                    excess += s
                    slope += s * (1.0 - s)
            if excess > 0:
                low = lam  # too many highs: a larger shift
            else:
                high = lam
            if abs(excess) <= 1e-9 * target or high - low <= 1e-12 * max(1.0, abs(lam)):
                break
            step = lam + excess / slope if slope > 0 else math.nan
            lam = step if low < step < high else 0.5 * (low + high)
        out[i] = lam


# ---- the entry points --------------------------------------------------------------------


_local = threading.local()


def _workspace(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised array for a table that lives within one call, from a per-thread
    buffer kept between calls: a fresh allocation of tens of MB costs more in page faults than
    the recursion that fills it. The buffer grows to the largest table asked for."""
    size = math.prod(shape) * np.dtype(dtype).itemsize
    buffer = getattr(_local, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = _local.buffer = np.empty(size, dtype=np.uint8)
    return buffer[:size].view(dtype).reshape(shape)


def _table_type(tensor: torch.Tensor) -> tuple[type, float]:
    """The precision tables are kept in between passes (float32 for float32 inputs, else
    float64), and the floor below which a kept probability is stored as 0."""
    if tensor.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return np.float32, 1e-37
    return np.float64, _FLUSH


def _numpy64(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float64).contiguous().numpy()


def _numpy_index(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.int64).contiguous().numpy()


def tilt(logits: torch.Tensor, total: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(B,)`` tilt of :func:`cbasr.distributions._tables.tilt_for_total` for CPU tensors
    ``logits (B, T)``, ``total (B,)``, ``lengths (B,)``; a constant (no gradient)."""
    out = np.empty(logits.shape[0])
    _tilts(_numpy64(logits), _numpy_index(lengths), _numpy_index(total), out)
    return torch.from_numpy(out).to(logits.dtype)


class LogNormaliser(torch.autograd.Function):
    """``log P(K = k)`` of independent trials with ``log_on = log p_t``, ``log_off =
    log(1 - p_t)`` (``(B, T)`` each; padding frames are not read) -> ``(B,)``.

    The backward is eq. (16): ``d/d log_on_t = P(B_t = 1 | k)`` and ``d/d log_off_t = 1 -
    P(B_t = 1 | k)`` on frames ``< lengths``. Under ``create_graph`` it differentiates the
    PyTorch recursion instead, so double backward works.
    """

    @staticmethod
    def forward(ctx, log_off, log_on, total, lengths, num_states):
        on, off = _numpy64(log_on.double().exp()), _numpy64(log_off.double().exp())
        index, n = _numpy_index(total), _numpy_index(lengths)
        B, T = on.shape
        dtype, floor = _table_type(log_on)
        prefix = np.empty((B, T + 1, num_states), dtype=dtype)
        normaliser = _normaliser_forward(on, off, n, index, prefix, floor)
        ctx.save_for_backward(log_off, log_on, total, lengths)
        ctx.kernel = (on, off, n, index, prefix, normaliser)
        ctx.num_states = num_states
        with np.errstate(divide="ignore"):
            return torch.from_numpy(np.log(normaliser)).to(log_on.dtype)

    @staticmethod
    def backward(ctx, grad):
        log_off, log_on, total, lengths = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the differentiable recursion
            grads = normaliser_double_backward(log_off, log_on, total, ctx.num_states, grad)
            return grads + (None, None, None)
        on, off, n, index, prefix, normaliser = ctx.kernel
        inclusion = np.zeros(on.shape)
        _inclusion(on, off, n, index, prefix, normaliser, inclusion)
        inclusion = torch.from_numpy(inclusion).to(log_on.dtype)
        possible = torch.from_numpy(normaliser > 0)
        grads = normaliser_gradients(grad, inclusion, possible, lengths)
        return grads + (None, None, None)


def _suffix_tables(logits, tilt, total, lengths):
    """Tilted trial probabilities and the suffix table of :func:`_suffix_table`, and whether
    each row's total can be met."""
    index, n = _numpy_index(total), _numpy_index(lengths)
    B, T = logits.shape
    on, off = np.empty((B, T)), np.empty((B, T))
    _probabilities(_numpy64(logits), _numpy64(tilt), n, on, off)
    num_states = int(index.max()) + 1 if B else 1
    dtype, floor = _table_type(logits)
    suffix = _workspace((B, T + 1, num_states), dtype)
    _suffix_table(on, off, n, index, suffix, floor)
    possible = suffix[np.arange(B), n, 0] > 0  # P(K = k): all n frames, j = 0
    return on, off, n, index, suffix, torch.from_numpy(possible)


def id_checking(
    logits, tilt, total, lengths, row_index, uniform
) -> tuple[torch.Tensor, torch.Tensor]:
    """ID-checking draws (eq. 11) for CPU tensors.

    Args:
        logits: ``(B, T)``; tilt: ``(B,)`` (see :func:`tilt`).
        total, lengths: ``(B,)``.
        row_index: ``(N,)`` parameter row of each sample row.
        uniform: ``(N, T)`` noise in ``(0, 1)``.

    Returns:
        ``(N, T)`` bool highs, and ``(B,)`` bool: whether ``total`` can be met at all (where
        it cannot, that row's draws are meaningless).
    """
    on, off, n, index, suffix, possible = _suffix_tables(logits, tilt, total, lengths)
    out = np.zeros(uniform.shape, dtype=np.bool_)
    _id_checking_draws(on, off, n, index, suffix, _numpy_index(row_index), _numpy64(uniform), out)
    return torch.from_numpy(out), possible


def bounded(logits, tilt, total, lengths, row_index, uniform) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounded Bernoulli draws (eq. 13) for CPU tensors, one uniform per high.

    Args: as :func:`id_checking`, but ``uniform (N, K)`` with ``K >= max(total)``.

    Returns:
        ``(N, K)`` int64 increasing frames (-1 for ``l >= total``), and :func:`id_checking`'s
        ``(B,)`` feasibility.
    """
    on, off, n, index, suffix, possible = _suffix_tables(logits, tilt, total, lengths)
    out = np.full(uniform.shape, -1, dtype=np.int64)
    _bounded_draws(on, off, n, index, suffix, _numpy_index(row_index), _numpy64(uniform), out)
    return torch.from_numpy(out), possible
