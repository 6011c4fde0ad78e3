"""Count tables: the dynamic programme behind every count function (package-internal).

One recursion over frames,

    table[t + 1, v] = logaddexp(table[t, v] + log_off[t], table[t, v - 1] + log_on[t]),

run forward for prefix tables and backward for suffix tables, with an explicit adjoint. With
``log_off = 0`` and ``log_on = logit`` it counts ``log C(v, frames < t; w)`` (eq. 8; the
Method 2 recursion of Chen and Liu, 1997). With ``log_off = log(1 - p_t)`` and
``log_on = log p_t`` it holds Poisson-Binomial log probabilities ``log P(K_{<t} = v)``
(eq. 5), which stay in ``(-inf, 0]``; the Conditional Bernoulli code uses these, for logits
shifted by a tilt that puts ``K = total`` near the PB mode (:func:`tilt_for_total`): every
ratio of counts in eqs. (9)-(16) is then a ratio of probabilities of modest size.

This module is the pure PyTorch reference and imports no kernel: the compiled kernels
(:mod:`cbasr.distributions._kernels`) import it, and :mod:`cbasr.distributions._dispatch`
chooses between the two per tensor.

Frames are 0-based: frame ``t`` here is frame ``t + 1`` of the paper. A prefix table's row
``t`` covers frames ``{0, ..., t - 1}`` (the paper's ``A_t``) and a suffix table's row ``t``
covers frames ``{t, ..., T - 1}`` (the paper's ``A_t^c``). Padding frames (``t >= lengths``)
are identity steps (``log_off = 0``, ``log_on = -inf``), so they change no value.
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__: list[str] = []  # package-internal

_NEG_INF = float("-inf")
_CHUNK = 64  # frames per block of the backward pass


class _CountRecursion(torch.autograd.Function):
    """The count recursion with an explicit adjoint (no per-step autograd graph).

    forward: ``log_off, log_on (T, B)`` -> ``table (T + 1, B, V)``, time-major; frames run
    forward (prefix table) or, with ``reverse``, backward from row ``T`` (suffix table).
    backward: the adjoint runs the recursion the other way; it is written in differentiable
    operations, so double backward works too.
    """

    @staticmethod
    def forward(ctx, log_off, log_on, num_states, reverse):
        table = _run_recursion(log_off, log_on, num_states, reverse)
        ctx.reverse = reverse
        ctx.save_for_backward(log_off, log_on, table)
        return table

    @staticmethod
    def backward(ctx, grad_table):
        log_off, log_on, table = ctx.saved_tensors
        reverse, T = ctx.reverse, log_off.shape[0]
        grads = grad_table.unbind(0)
        adjoint = grads[0 if reverse else T]  # d loss / d (last row written), in full
        grad_off, grad_on = {}, {}
        # Frames in the opposite order to the forward pass, in chunks: the branch shares of a
        # chunk are computed at once, and only a chunk's worth of them is ever held.
        order = list(_frames(T, not reverse))
        for chunk in (order[i : i + _CHUNK] for i in range(0, T, _CHUNK)):
            low, high = min(chunk), max(chunk) + 1
            src = table[low + 1 : high + 1] if reverse else table[low:high]  # (C, B, V)
            dst = table[low:high] if reverse else table[low + 1 : high + 1]
            # Share of dst[v] from each branch: stay at v, or move v - 1 -> v.
            w_stay = _share(src + log_off[low:high].unsqueeze(-1) - dst)  # (C, B, V)
            w_move = _share(src[..., :-1] + log_on[low:high].unsqueeze(-1) - dst[..., 1:])
            stays, moves = w_stay.unbind(0), w_move.unbind(0)
            adjoints = [None] * (high - low)  # d loss / d dst, per frame of the chunk
            for t in chunk:
                adjoints[t - low] = adjoint
                back = torch.addcmul(grads[_rows_of_frame(t, reverse)[0]], adjoint, stays[t - low])
                back[:, :-1].addcmul_(adjoint[:, 1:], moves[t - low])  # v came from v - 1
                adjoint = back
            adjoints = torch.stack(adjoints)  # (C, B, V)
            grad_off[low] = (adjoints * w_stay).sum(-1)
            grad_on[low] = (adjoints[..., 1:] * w_move).sum(-1)
        if T == 0:
            return torch.zeros_like(log_off), torch.zeros_like(log_on), None, None
        starts = sorted(grad_off)
        grad_off = torch.cat([grad_off[i] for i in starts])  # (T, B), frame order
        grad_on = torch.cat([grad_on[i] for i in starts])
        return grad_off, grad_on, None, None


def _run_recursion(log_off, log_on, num_states: int, reverse: bool) -> torch.Tensor:
    """The count recursion, no autograd: ``(T, B)`` log-weights -> ``(T + 1, B, V)`` table."""
    T, B = log_off.shape
    table = log_off.new_empty(T + 1, B, num_states)  # every row is written below
    first = T if reverse else 0
    table[first] = _NEG_INF
    table[first, :, 0] = 0.0  # before any frame, the count is 0
    # Per-step views made once: indexing inside the loop costs more than the arithmetic.
    rows, heads = table.unbind(0), table[:, :, :-1].unbind(0)
    offs, ons = log_off.unsqueeze(-1).unbind(0), log_on.unsqueeze(-1).unbind(0)  # (B, 1) each
    stay = log_off.new_empty(B, num_states)
    move = log_off.new_full((B, num_states), _NEG_INF)  # column 0 stays -inf
    grow = move[:, 1:]
    for t in _frames(T, reverse):
        src, dst = _rows_of_frame(t, reverse)
        torch.add(rows[src], offs[t], out=stay)  # B_t = 0: the count stays
        torch.add(heads[src], ons[t], out=grow)  # B_t = 1: the count grows
        torch.logaddexp(stay, move, out=rows[dst])
    return table


def _frames(T: int, reverse: bool) -> range:
    return range(T - 1, -1, -1) if reverse else range(T)


def _rows_of_frame(t: int, reverse: bool) -> tuple[int, int]:
    """The table rows frame ``t`` reads and writes: prefix ``t -> t + 1``, suffix ``t + 1 -> t``."""
    return (t + 1, t) if reverse else (t, t + 1)


def _share(log_share: torch.Tensor) -> torch.Tensor:
    """``exp(log_share)``, with 0 for NaN (an unreachable ``-inf - -inf`` state) and for
    shares below the smallest normal number (subnormal arithmetic is very slow on CPU and
    such shares cannot change a gradient). Masked entries go through ``exp(0)``: ``exp`` of
    ``-inf`` is a slow path too. NaN-free in both directions."""
    drop = ~(log_share > math.log(torch.finfo(log_share.dtype).tiny))
    return torch.exp(log_share.masked_fill(drop, 0.0)).masked_fill(drop, 0.0)


def count_table(
    log_off: torch.Tensor, log_on: torch.Tensor, num_states: int, suffix: bool = False
) -> torch.Tensor:
    """Run the count recursion over frames.

    Args:
        log_off: ``(B, T)`` log-weight of a low frame (0 for counts, ``log(1 - p)`` for PB).
        log_on: ``(B, T)`` log-weight of a high frame (the logit, or ``log p``); padding
            frames must hold ``log_off = 0`` and ``log_on = -inf``.
        num_states: ``V``; counts ``v = 0..V-1`` are kept (larger ones are never needed).
        suffix: False for a prefix table (row ``t`` covers frames ``< t``), True for a suffix
            table (row ``t`` covers frames ``>= t``).

    Returns:
        ``(T + 1, B, V)`` time-major table of log counts (or log probabilities).
    """
    off = log_off.transpose(0, 1).contiguous()  # (B, T) -> (T, B)
    on = log_on.transpose(0, 1).contiguous()
    return _CountRecursion.apply(off, on, num_states, suffix)


def prefix_and_suffix_tables(
    log_off: torch.Tensor, log_on: torch.Tensor, num_states: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both tables of :func:`count_table` from one pass of the recursion.

    The reversed frames ride along as extra batch rows, so the T serial steps are paid once.

    Returns:
        prefix and suffix tables, ``(T + 1, B, V)`` each.
    """
    B = log_off.shape[0]
    off = torch.cat([log_off, log_off.flip(-1)]).transpose(0, 1)  # (2B, T) -> (T, 2B)
    on = torch.cat([log_on, log_on.flip(-1)]).transpose(0, 1)
    table = _CountRecursion.apply(off.contiguous(), on.contiguous(), num_states, False)
    # Rows B.. are the prefix table of the reversed frames: row s covers frames >= T - s.
    return table[:, :B], table[:, B:].flip(0)


def inclusion_probabilities(log_on, prefix, suffix, total, normaliser) -> torch.Tensor:
    """``P(B_t = 1 | k)``, eq. (16), as the sum over ``l`` of eq. (15).

    ``sum_l P(l highs before t) p_t P(k - 1 - l highs after t) / P(K = k)``, in chunks of
    frames so that only ``(C, B, k)`` terms are held at once. Differentiable.

    Args:
        log_on: ``(B, T)`` ``log p_t``.
        prefix, suffix: ``(T + 1, B, V)`` tables.
        total: ``(B,)``; normaliser: ``(B,)`` ``log P(K = total)``.

    Returns:
        ``(B, T)``; 0 on padding and for an impossible total.
    """
    T, K = log_on.shape[-1], prefix.shape[-1] - 1
    after = total.unsqueeze(-1) - 1 - torch.arange(K, device=total.device)  # (B, K): highs after t
    # An impossible total (normaliser -inf) divides by +inf instead: every term is then 0.
    normaliser = normaliser.masked_fill(normaliser == _NEG_INF, float("inf"))
    on = log_on.t().unsqueeze(-1) - normaliser.unsqueeze(-1)  # (B, T) -> (T, B, 1)
    chunks = []
    for start in range(0, T, _CHUNK):
        end = min(start + _CHUNK, T)
        before_t = prefix[start:end, :, :K]  # (C, B, K): l highs before t
        after_t = gather_states(suffix[start + 1 : end + 1], after)  # (C, B, K)
        # Marginal Bounded Bernoulli probability, CB paper eq. (15), summed over l (eq. 16).
        chunks.append(torch.exp(before_t + after_t + on[start:end]).sum(-1))
    if not chunks:
        return log_on.new_zeros(log_on.shape)
    return torch.cat(chunks).t()  # (T, B) -> (B, T)


def normaliser_double_backward(log_off, log_on, total, num_states, grad):
    """The gradient of ``grad * log P(K = total)`` with respect to ``(log_off, log_on)`` through
    the differentiable recursion, with a graph: what a kernel's backward returns under
    ``create_graph``, so that double backward works whichever backend ran the forward."""
    with torch.enable_grad():
        table = count_table(log_off, log_on, num_states)[-1]  # (B, V)
        normaliser = gather_states(table, total.unsqueeze(-1)).squeeze(-1)
        return torch.autograd.grad(
            normaliser, (log_off, log_on), grad, create_graph=True, allow_unused=True
        )


def normaliser_gradients(grad, inclusion, possible, lengths):
    """The gradient of ``grad * log P(K = total)`` ``(B,)`` with respect to ``(log_off,
    log_on)`` from the inclusion probabilities ``(B, T)`` (eq. 16): ``1 - P(B_t = 1 | k)`` and
    ``P(B_t = 1 | k)`` on frames ``< lengths`` of rows whose total is ``possible`` ``(B,)``,
    0 elsewhere. What every kernel's backward returns."""
    T = inclusion.shape[-1]
    inside = torch.arange(T, device=inclusion.device) < lengths.to(inclusion.device).unsqueeze(-1)
    keep = possible.to(inclusion.device).unsqueeze(-1) & inside
    grad = grad.unsqueeze(-1)
    return torch.where(keep, grad * (1 - inclusion), 0.0), torch.where(keep, grad * inclusion, 0.0)


def gather_states(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[..., index]`` along the last (count) dimension, ``-inf`` where out of range.

    ``values (..., V)`` and ``index (..., M)`` broadcast over the leading dimensions.
    """
    num_states = values.shape[-1]
    inside = (index >= 0) & (index < num_states)
    safe = index.clamp(0, num_states - 1)
    shape = torch.broadcast_shapes(values.shape[:-1], index.shape[:-1])
    values = values.expand(shape + values.shape[-1:])
    gathered = values.gather(-1, safe.expand(shape + index.shape[-1:]))
    return torch.where(inside, gathered, _NEG_INF)


def log_sum_exp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``logsumexp`` that gives ``-inf`` and a zero (not NaN) gradient when all terms are ``-inf``."""
    shift = x.detach().amax(dim, keepdim=True)
    shift = torch.nan_to_num(shift, nan=0.0, posinf=0.0, neginf=0.0)  # non-finite: 0
    total = torch.exp(x - shift).sum(dim)
    positive = total > 0
    out = torch.log(torch.where(positive, total, 1.0)) + shift.squeeze(dim)
    return torch.where(positive, out, _NEG_INF)


def log_ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator - denominator`` of two log values; ``-inf`` when the denominator is ``-inf``.

    A ``-inf`` denominator marks an impossible state; the step out of it is impossible too.
    """
    impossible = denominator == _NEG_INF
    return torch.where(impossible, _NEG_INF, numerator - torch.where(impossible, 0.0, denominator))


def bernoulli_log_weights(
    logits: torch.Tensor, valid: torch.Tensor, tilt: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-frame ``(log(1 - p_t), log p_t)`` with ``p_t = sigmoid(logit_t - tilt)``.

    Args:
        logits: ``(B, T)``; ``+-inf`` allowed (a frame that always / never fires).
        valid: ``(B, T)`` bool frame mask; padding gets the identity step ``(0, -inf)``.
        tilt: ``(B,)`` constant shift of the logits (see :func:`tilt_for_total`), or None.

    Returns:
        ``log_off, log_on``, each ``(B, T)``.
    """
    if tilt is not None:
        logits = logits - tilt.unsqueeze(-1)
    log_off = torch.where(valid, F.logsigmoid(-logits), 0.0)
    log_on = torch.where(valid, F.logsigmoid(logits), _NEG_INF)
    return log_off, log_on


def tilt_for_total(logits: torch.Tensor, total: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A constant ``lambda (B,)`` such that ``sum_t sigmoid(logit_t - lambda) ~= total``.

    Adding a constant to every logit scales ``C(v, S; w)`` by ``exp(v * c)`` and leaves the
    Conditional Bernoulli (eq. 4) unchanged. Choosing the shift so that the Poisson-Binomial
    mean equals ``total`` (an exponential tilt) puts ``K = total`` near the PB mode, so the
    normalised tables never hold far-tail probabilities on the paths that matter: float32
    stays accurate for long sequences and extreme logits. Found in float64 by bisection here;
    the compiled kernel takes safeguarded Newton steps
    (:func:`cbasr.distributions._dispatch.tilt_for_total`). It is a constant (no gradient),
    and the results are exactly invariant to it. ``valid`` is a frame mask
    (:func:`cbasr.distributions._arguments.frame_mask`).
    """
    if logits.shape[-1] == 0:  # no frames: any shift will do
        return logits.new_zeros(logits.shape[:-1])
    x = logits.detach().double()
    finite = valid & torch.isfinite(x)
    always = valid & (x == float("inf"))
    count = finite.sum(-1)
    target = (total - always.sum(-1)).double()
    target = torch.minimum(target.clamp(min=0.5), count.double() - 0.5)
    low = torch.where(finite, x, float("inf")).amin(-1)
    high = torch.where(finite, x, _NEG_INF).amax(-1)
    low = torch.where(count > 0, low - 40.0, 0.0)
    high = torch.where(count > 0, high + 40.0, 0.0)
    for _ in range(40):
        mid = 0.5 * (low + high)
        mean = torch.where(finite, torch.sigmoid(x - mid.unsqueeze(-1)), 0.0).sum(-1)
        too_many = mean > target
        low = torch.where(too_many, mid, low)
        high = torch.where(too_many, high, mid)
    return (0.5 * (low + high)).to(logits.dtype)


class ConditionalTables(NamedTuple):
    """Tilted Poisson-Binomial tables for a batch of Conditional Bernoulli parameters.

    With ``p_t = sigmoid(logit_t - tilt)`` and ``K_S`` the number of highs in frames ``S``:
    ``C(v, S; w) = exp(v * tilt) * P(K_S = v) * prod_{s in S} (1 + w_s e^{-tilt})``, so every
    ratio of counts in eqs. (9)-(16) is a ratio of these probabilities times the ``p_t`` or
    ``1 - p_t`` of the frames that differ.

    Attributes:
        log_off: ``(B, T)`` ``log(1 - p_t)``; 0 on padding.
        log_on: ``(B, T)`` ``log p_t``; ``-inf`` on padding.
        prefix: ``(T + 1, B, V)`` ``log P(K_{frames < t} = v)``, or None if not asked for.
        suffix: ``(T + 1, B, V)`` ``log P(K_{frames >= t} = v)``, or None.
        total: ``(B,)`` int64 number of highs ``k``; ``V = max(k) + 1``.
        lengths: ``(B,)`` int64.
        valid: ``(B, T)`` bool frame mask.
        normaliser: ``(B,)`` ``log P(K = k)`` where it was computed without a prefix table
            (:func:`cbasr.distributions._dispatch.conditional_normaliser`), else None.
    """

    log_off: torch.Tensor
    log_on: torch.Tensor
    prefix: torch.Tensor | None
    suffix: torch.Tensor | None
    total: torch.Tensor
    lengths: torch.Tensor
    valid: torch.Tensor
    normaliser: torch.Tensor | None = None

    def log_normaliser(self) -> torch.Tensor:
        """``(B,)`` ``log P(K = k)`` under the tilted PB: ``C(k, I; w)`` up to known factors."""
        if self.normaliser is not None:
            return self.normaliser
        T = self.log_off.shape[-1]
        return gather_states(self.prefix[T], self.total.unsqueeze(-1)).squeeze(-1)


class SkippedLogOff(NamedTuple):
    """Prefix sums over frames ``u < t`` of ``(B, T)`` ``log(1 - p_u)``, ``(B, T + 1)`` each,
    so that the log probability of skipping frames ``s <= u < e`` (none of them high, as the
    Bounded Bernoulli step between two highs does, eq. 13) is a difference
    (:meth:`between`), accurate for long sequences.

    Attributes:
        finite: float64 sums of the finite ``log(1 - p_u)``.
        forced: int64 counts of the frames with ``log(1 - p_u) = -inf`` (a ``+inf`` logit: a
            frame that is always high), kept apart: a sum over them is ``-inf`` and a
            difference of two such sums NaN.
    """

    finite: torch.Tensor
    forced: torch.Tensor

    @classmethod
    def of(cls, log_off: torch.Tensor) -> "SkippedLogOff":
        """The sums of ``log_off (B, T)``."""
        forced = log_off == _NEG_INF
        finite = torch.where(forced, 0.0, log_off.double())
        return cls(F.pad(finite.cumsum(-1), (1, 0)), F.pad(forced.long().cumsum(-1), (1, 0)))

    def rows(self, row_index: torch.Tensor) -> "SkippedLogOff":
        """The sums of parameter rows ``row_index (N,)``: ``(N, T + 1)`` each."""
        return SkippedLogOff(self.finite[row_index], self.forced[row_index])

    def at(self, frames: torch.Tensor) -> "SkippedLogOff":
        """The sums at ``frames (N, L)`` of each row (``0 <= frames <= T``): ``(N, L)`` each."""
        return SkippedLogOff(self.finite.gather(1, frames), self.forced.gather(1, frames))

    @staticmethod
    def between(start: "SkippedLogOff", end: "SkippedLogOff", dtype) -> torch.Tensor:
        """``sum_{s <= u < e} log(1 - p_u)`` in ``dtype`` from the sums at ``s`` and at ``e``
        (broadcast): ``-inf`` where a skipped frame is always high."""
        skipped = (end.finite - start.finite).to(dtype)
        return torch.where(end.forced > start.forced, _NEG_INF, skipped)


def suffix_at(suffix: torch.Tensor, row_index, frames, states) -> torch.Tensor:
    """``suffix[frames, row, states]`` for ``suffix (T + 1, B, V)``; ``-inf`` out of range.

    ``row_index (N, 1)``, ``frames`` and ``states`` broadcast to the output shape.
    """
    _, B, num_states = suffix.shape
    inside = (states >= 0) & (states < num_states)
    # A flat gather is much faster on CPU than indexing with three index tensors.
    flat = (frames * B + row_index) * num_states + states.clamp(0, num_states - 1)
    value = suffix.reshape(-1).gather(0, flat.reshape(-1)).view(flat.shape)
    return torch.where(inside, value, _NEG_INF)
