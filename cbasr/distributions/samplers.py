"""Exact Conditional Bernoulli samplers, one per decomposition (CB paper section 2.1).

- :func:`id_checking_sample`: T Bernoulli steps (eq. 11), each decided by logistic noise,
  ``b_t = H(Z_t) = [l_t + D_t > 0]`` (eq. 35). Serial depth T.
- :func:`bounded_bernoulli_sample`: k categorical steps over frames (eq. 13), each by the
  Gumbel-max trick (eq. 33). Serial depth k (after a T-step table). On CPU a compiled kernel
  inverts each step's distribution with one uniform instead (the same distribution).
- :func:`draft_sample`: the Draft Bernoulli (eqs. 9-10). By eq. (10) every order of a set
  ``A`` has probability ``P(A | k) / k!``, so a CB set put in a uniformly random order is an
  exact draft: a bounded sample followed by a random permutation.

All three draw from the same CB (eq. 4). On CPU, ID-checking and the bounded steps run as
compiled loops over a probability-space suffix table (:mod:`cbasr.distributions._kernels`).
They are batched (the Python loop runs over frames
or highs, never over the batch), take a ``torch.Generator`` for reproducibility, and compute
the suffix table once per parameter row however many samples are drawn.
"""

from typing import NamedTuple

import torch

from cbasr import _backends
from cbasr.checks import check_that
from cbasr.distributions import _kernels
from cbasr.distributions._arguments import (
    Arguments,
    broadcast_arguments,
    check_total,
    frame_mask,
    largest_total,
)
from cbasr.distributions._dispatch import conditional_tables, tilt_for_total
from cbasr.distributions._tables import ConditionalTables, SkippedLogOff, log_ratio, suffix_at

__all__ = [
    "id_checking_sample",
    "bounded_bernoulli_sample",
    "draft_sample",
    "logistic_noise",
    "gumbel_noise",
    "times_to_sequence",
    "sequence_to_times",
]

_NEG_INF = float("-inf")


def _uniform_noise(shape, generator, dtype, device) -> torch.Tensor:
    """Uniform noise in ``(0, 1)``: ``torch.rand`` is in ``[0, 1)``, so 0 is lifted to ``tiny``."""
    u = torch.rand(shape, generator=generator, dtype=dtype, device=device)
    return u.clamp_(min=torch.finfo(dtype).tiny)


def logistic_noise(shape, generator=None, dtype=torch.float32, device=None) -> torch.Tensor:
    """``D = log U - log(1 - U)``, ``U ~ Uniform(0, 1)`` (eq. 35); always finite."""
    u = _uniform_noise(shape, generator, dtype, device)
    return torch.log(u) - torch.log1p(-u)


def gumbel_noise(shape, generator=None, dtype=torch.float32, device=None) -> torch.Tensor:
    """``G = -log(-log U)``, ``U ~ Uniform(0, 1)`` (eq. 32); always finite."""
    return -torch.log(-torch.log(_uniform_noise(shape, generator, dtype, device)))


_CANNOT_MEET = "total cannot be met: too few frames with a finite or +inf logit, or too many +inf"


def _check_met(possible: torch.Tensor, args: Arguments) -> None:
    """Raise ValueError unless every row's total can be met (``possible (B,)``), with
    :func:`check_total`'s more precise error where it applies; in an enclosing
    :func:`cbasr.checks.one_read` block, with its read."""

    def fail():
        check_total(args.total, args.lengths)
        raise ValueError(_CANNOT_MEET)

    check_that(possible, fail)


def _prepare_sampling(
    logits, total, lengths, sample_shape, max_total=None
) -> tuple[Arguments, ConditionalTables, torch.Tensor]:
    """Broadcast, check that ``total`` can be met, build the suffix table, index sample rows.

    Returns:
        the arguments, their tables, and ``(N,)`` parameter row of each of the
        ``N = prod(sample_shape) * B`` sample rows.
    """
    args = broadcast_arguments(logits, total, lengths, max_total)
    check_total(args.total, args.lengths)  # no sequence exists otherwise: always an error
    tables = conditional_tables(args, prefix=False)
    rows = torch.arange(len(args.total), device=args.total.device)
    _check_met(suffix_at(tables.suffix, rows, 0, args.total) != _NEG_INF, args)
    num_rows = torch.Size(sample_shape).numel() * len(args.total)
    row_index = torch.arange(num_rows, device=args.logits.device) % max(len(args.total), 1)
    return args, tables, row_index


def _id_checking_log_odds(on, off, suffix_on, suffix_off) -> torch.Tensor:
    """Log odds of the ID-checking step (eq. 11): ``log P(b_t = 1 | r) - log P(b_t = 0 | r)``.

    ``log p_t + log P(K_{>t} = r - 1)`` against ``log(1 - p_t) + log P(K_{>t} = r)``;
    ``+inf`` where a high is forced, ``-inf`` where a low is. Elementwise, so the sampling
    loop and the vectorised recomputation give the same bits.
    """
    numerator = on + suffix_on
    denominator = off + suffix_off
    odds = torch.where(denominator == _NEG_INF, float("inf"), numerator - denominator)
    return torch.where(numerator == _NEG_INF, _NEG_INF, odds)


def _id_checking_loop(tables: ConditionalTables, row_index, noise) -> torch.Tensor:
    """ID-checking sampling (eq. 11): ``b_t = [log_odds_t + D_t > 0]``, frame by frame.

    ``noise (N, T)`` logistic -> ``(N, T)`` bool. Serial depth T; a few ops on ``(N,)`` per
    step. The log odds are those of :func:`_id_checking_log_odds`, bit for bit, except NaN
    instead of ``-inf`` in an impossible state (never reached), where the test is False too.
    """
    N, T = noise.shape
    remaining = tables.total[row_index].clone()  # highs still to place
    following = tables.suffix.unbind(0)  # (B, V) per row t
    # (N, T) -> T columns of (N,), made once: indexing inside the loop costs more than the work.
    on = tables.log_on[row_index].t().unbind(0)
    off = tables.log_off[row_index].t().unbind(0)
    noises = noise.t().unbind(0)
    same_rows = N == tables.log_on.shape[0]  # one sample per row: row_index is arange(N)
    highs = []
    for t in range(T):
        suffix = following[t + 1] if same_rows else following[t + 1].index_select(0, row_index)
        states = torch.stack([(remaining - 1).clamp(min=0), remaining], dim=1)  # (N, 2)
        pair = suffix.gather(1, states)  # log P(K_{>t} = r - 1), log P(K_{>t} = r)
        suffix_on = pair[:, 0].masked_fill(remaining == 0, _NEG_INF)
        log_odds = (on[t] + suffix_on) - (off[t] + pair[:, 1])
        high = log_odds + noises[t] > 0
        highs.append(high)
        remaining = remaining - high.long()
    if not highs:  # no frames
        return torch.zeros(N, 0, dtype=torch.bool, device=noise.device)
    return torch.stack(highs, dim=1)


class _BoundedRows(NamedTuple):
    """Per-sample-row inputs of the bounded step, gathered once per sampling run.

    Attributes:
        row_index: ``(N,)`` parameter row of each sample row.
        log_on: ``(N, T)`` ``log p_t``.
        skipped_off: ``(N, T + 1)`` sums of ``log(1 - p_u)`` over ``u < t``
            (:class:`~cbasr.distributions._tables.SkippedLogOff`), so that the frames skipped
            between two highs are a difference.
        suffix_by_count: ``(B, V, T + 1)`` the suffix table with frames last, so that a step
            reads one contiguous row ``log P(K_{>=t} = r)`` over ``t``.
    """

    row_index: torch.Tensor
    log_on: torch.Tensor
    skipped_off: SkippedLogOff
    suffix_by_count: torch.Tensor


def _bounded_rows(tables: ConditionalTables, row_index: torch.Tensor) -> _BoundedRows:
    skipped_off = SkippedLogOff.of(tables.log_off).rows(row_index)  # (N, T + 1)
    suffix_by_count = tables.suffix.permute(1, 2, 0).contiguous()  # (T + 1, B, V) -> (B, V, T + 1)
    return _BoundedRows(row_index, tables.log_on[row_index], skipped_off, suffix_by_count)


def _bounded_step_log_probs(
    tables: ConditionalTables, rows: _BoundedRows, prev, remaining
) -> torch.Tensor:
    """Bounded Bernoulli step (eq. 13) for every candidate frame.

    ``log P(t_l = t | t_{l-1} = prev, k - l = remaining)`` for all ``t``; ``-inf`` for
    ``t <= prev``, padding, or frames that leave too few frames after them.

    Args:
        tables: the CB tables (suffix needed).
        rows: the sample rows' inputs (:func:`_bounded_rows`).
        prev: ``(N, L)`` previous emission frame (-1 before the first).
        remaining: ``(N, L)`` highs still to place after this one.

    Returns:
        ``(N, L, T)``.
    """
    T = tables.log_on.shape[-1]
    frames = torch.arange(T, device=prev.device)
    start = SkippedLogOff(*(x.unsqueeze(-1) for x in rows.skipped_off.at(prev + 1)))  # (N, L, 1)
    end = SkippedLogOff(*(x[:, :T].unsqueeze(1) for x in rows.skipped_off))  # (N, 1, T)
    skipped = SkippedLogOff.between(start, end, rows.log_on.dtype)  # (N, L, T)
    row = rows.row_index.unsqueeze(-1)  # (N,) -> (N, 1)
    following = rows.suffix_by_count[row, remaining][..., 1:]  # (N, L, T): log P(K_{>t} = r)
    current = rows.suffix_by_count[row, remaining + 1, prev + 1].unsqueeze(-1)  # (N, L, 1)
    step = log_ratio(rows.log_on.unsqueeze(1) + skipped + following, current)
    return torch.where(frames > prev.unsqueeze(-1), step, _NEG_INF)


def _bounded_loop(
    tables: ConditionalTables, rows: _BoundedRows, num_highs: int, generator=None, keep_noise=False
):
    """Bounded Bernoulli sampling (eq. 13) by Gumbel-max (eq. 33), one high at a time.

    ``rows`` from :func:`_bounded_rows`.

    Returns:
        ``times (N, K)`` int64 (-1 for ``l >= total``) and, if ``keep_noise``, the Gumbel
        noise ``(N, K, T)`` used (else None). Serial depth K; ops on ``(N, T)`` per step.
    """
    N, T = rows.log_on.shape
    total = tables.total[rows.row_index]
    prev = torch.full((N,), -1, dtype=torch.long, device=total.device)
    times = torch.full((N, num_highs), -1, dtype=torch.long, device=total.device)
    noises = []
    for l in range(num_highs):
        active = l < total
        remaining = (total - 1 - l).clamp(min=0)
        step = _bounded_step_log_probs(tables, rows, prev.unsqueeze(-1), remaining.unsqueeze(-1))[
            :, 0
        ]
        noise = gumbel_noise((N, T), generator, step.dtype, step.device)
        choice = (step + noise).argmax(-1)
        times[:, l] = torch.where(active, choice, -1)
        prev = torch.where(active, choice, prev)
        if keep_noise:
            noises.append(noise)
    noise = torch.stack(noises, 1) if keep_noise and noises else None
    return times, noise


def id_checking_sample(
    logits,
    total,
    lengths=None,
    sample_shape=torch.Size(),
    generator: torch.Generator | None = None,
    *,
    max_total: int | None = None,
) -> torch.Tensor:
    """Draw CB sequences by ID-checking (eq. 11).

    Args:
        logits: ``(*, T)`` log odds; total: ``(*,)`` highs; lengths: ``(*,)`` frames.
        sample_shape: leading sample dimensions.
        generator: source of randomness (on the logits' device), or None for the global one.
        max_total: a bound on every total that the caller knows (its rewards' label columns,
            say): the tables are sized by it, and the largest total is not read from the
            device.

    Returns:
        ``(*sample_shape, *, T)`` 0./1. in the logits' dtype: exactly ``total`` highs, all
        before ``lengths``. Raises ValueError if ``total`` cannot be met (in an enclosing
        :func:`cbasr.checks.one_read` block, at its read). Not differentiable.
    """
    which = _sampler_backend(logits)
    if which != "torch":
        return _kernel_sample(
            "id_checking", which, logits, total, lengths, sample_shape, generator, max_total
        )
    with torch.no_grad():
        args, tables, row_index = _prepare_sampling(logits, total, lengths, sample_shape, max_total)
        T = args.logits.shape[-1]
        noise = logistic_noise(
            (len(row_index), T), generator, args.logits.dtype, args.logits.device
        )
        high = _id_checking_loop(tables, row_index, noise)
    return high.to(args.logits.dtype).reshape(torch.Size(sample_shape) + args.batch_shape + (T,))


def _sampler_backend(logits: torch.Tensor) -> str:
    """The sampler's one dispatch point: ``numba`` (the compiled CPU kernels), ``triton`` (the
    kernels of :mod:`cbasr.distributions._tables_triton`, float32 and float64) or ``torch``."""
    which = _backends.backend(logits)
    if which == "triton" and logits.dtype not in (torch.float32, torch.float64):
        return "torch"
    return which


def _kernel_sample(
    kind, which, logits, total, lengths, sample_shape, generator, max_total
) -> torch.Tensor:
    """A sampler by the kernels of backend ``which`` (``numba``:
    :mod:`cbasr.distributions._kernels`; ``triton``: :mod:`cbasr.distributions._tables_triton`).
    ``kind="id_checking"``: ID-checking (eq. 11) deciding frame ``t`` by the uniform ``U_t``
    whose logistic transform the PyTorch loop uses (eq. 35), so all three give the same draws;
    ``"bounded"``: Bounded Bernoulli steps (eq. 13), each by inverting its distribution with one
    uniform per high (the PyTorch loop takes the Gumbel-max of eq. 33 instead: the same
    distribution, other draws).

    Returns:
        ``(*sample_shape, *, T)`` 0./1. (ID-checking) or ``(*sample_shape, *, K)`` int64 times.
    """
    with torch.no_grad():
        args = broadcast_arguments(logits, total, lengths, max_total)
        T = args.logits.shape[-1]
        num_rows = torch.Size(sample_shape).numel() * len(args.total)
        K = largest_total(args)
        width = T if kind == "id_checking" else K
        uniform = _uniform_noise(
            (num_rows, width), generator, args.logits.dtype, args.logits.device
        )
        if which == "numba":
            check_total(args.total, args.lengths)
            tilt = tilt_for_total(args.logits, args.total, frame_mask(args.lengths, T))
            row_index = torch.arange(num_rows) % max(len(args.total), 1)
            drawn, possible = getattr(_kernels, kind)(
                args.logits, tilt, args.total, args.lengths, row_index, uniform
            )
        else:  # the total checked by the kernel's table (sample row m of parameter row m % B)
            from cbasr.distributions import _tables_triton

            tilt = _tables_triton.tilt(args.logits, args.total, args.lengths)
            sized = (K + 1,) if kind == "id_checking" else ()  # (bounded: by the uniforms)
            drawn, possible = getattr(_tables_triton, kind)(
                args.logits, tilt, args.total, args.lengths, uniform, *sized
            )
        _check_met(possible, args)
    if kind == "id_checking":
        drawn = drawn.to(args.logits.dtype)
    return drawn.reshape(torch.Size(sample_shape) + args.batch_shape + (width,))


def bounded_bernoulli_sample(
    logits,
    total,
    lengths=None,
    sample_shape=torch.Size(),
    generator: torch.Generator | None = None,
    *,
    max_total: int | None = None,
) -> torch.Tensor:
    """Draw CB emission times by Bounded Bernoulli steps (eq. 13).

    Args: as :func:`id_checking_sample`.

    Returns:
        ``(*sample_shape, *, K)`` int64 increasing frames, ``K = max(total)`` (``max_total``
        where given; both at most ``T``); entries ``l >= total`` are -1. Not differentiable.
    """
    which = _sampler_backend(logits)
    if which != "torch":
        return _kernel_sample(
            "bounded", which, logits, total, lengths, sample_shape, generator, max_total
        )
    with torch.no_grad():
        args, tables, row_index = _prepare_sampling(logits, total, lengths, sample_shape, max_total)
        K = largest_total(args)
        times, _ = _bounded_loop(tables, _bounded_rows(tables, row_index), K, generator)
    return times.reshape(torch.Size(sample_shape) + args.batch_shape + (K,))


def draft_sample(
    logits, total, lengths=None, sample_shape=torch.Size(), generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw ordered Draft Bernoulli samples (eqs. 9-10): a CB set in uniformly random order.

    Returns:
        ``(*sample_shape, *, K)`` int64 drafted frames in draw order, ``K = max(total)``;
        entries ``j >= total`` are -1. Not differentiable.
    """
    times = bounded_bernoulli_sample(logits, total, lengths, sample_shape, generator)
    # Uniform random order: sort by i.i.d. keys (float64, so that ties are negligible).
    keys = torch.rand(times.shape, generator=generator, dtype=torch.float64, device=times.device)
    keys = torch.where(times >= 0, keys, 2.0)  # padding sorts last
    return times.gather(-1, keys.argsort(-1))


def times_to_sequence(times: torch.Tensor, num_frames: int, dtype=torch.float32) -> torch.Tensor:
    """``(..., K)`` emission frames (-1 = none) -> ``(..., T)`` binary sequence."""
    hit = torch.where(times >= 0, times, num_frames)  # -1 -> a dummy frame T
    b = torch.zeros(times.shape[:-1] + (num_frames + 1,), dtype=dtype, device=times.device)
    return b.scatter(-1, hit, 1.0)[..., :num_frames]


def sequence_to_times(b: torch.Tensor, num_times: int | None = None) -> torch.Tensor:
    """``(..., T)`` binary sequence -> ``(..., K)`` increasing frames of its highs, -1 padded.

    ``K = num_times``, or the largest count in ``b``.
    """
    T = b.shape[-1]
    high = b != 0
    if num_times is None:
        num_times = int(high.sum(-1).max()) if high.numel() else 0
    # The j-th high goes to slot j; lows, and highs beyond num_times, to a dummy slot.
    slot = torch.where(high, high.cumsum(-1) - 1, num_times).clamp(max=num_times)
    frames = torch.arange(T, device=b.device).expand(b.shape)
    times = torch.full(b.shape[:-1] + (num_times + 1,), -1, dtype=torch.long, device=b.device)
    return times.scatter(-1, slot, frames)[..., :num_times]
