"""Per-step log probabilities of the three decompositions of the CB (CB paper section 2.1).

- ID-checking Bernoulli (IDB), eqs. (11)-(12): one Bernoulli step per frame, conditioned on
  the number of highs still to place.
- Draft Bernoulli (DB), eqs. (9)-(10): one categorical step per drafted frame, in draw order.
- Bounded Bernoulli (BB), eqs. (13)-(15): one categorical step per high, in time order, each
  bounded to the frames after the previous high.

The steps of one sample sum to ``log P(b | k)`` (eqs. 12, 14), or to ``log P(b | k) - log k!``
for the draft (eq. 10). The REINFORCE estimators of section 2.2 weight them by rewards
(eqs. 23, 28, 29). Every step is a ratio of suffix counts ``C(v, A_t^c; w)``, computed from
the tilted Poisson-Binomial tables of :mod:`cbasr.distributions._tables`.

Impossible steps (a value that breaks the constraints) are ``-inf``; steps that do not exist
(padding frames, or entries ``l >= total`` of a padded draft) are 0.
"""

import torch
import torch.nn.functional as F

from cbasr.distributions._arguments import (
    broadcast_arguments,
    frame_mask,
    largest_total,
    value_rows,
)
from cbasr.distributions._dispatch import conditional_tables, count_table, tilt_for_total
from cbasr.distributions._tables import (
    ConditionalTables,
    SkippedLogOff,
    bernoulli_log_weights,
    gather_states,
    log_ratio,
    log_sum_exp,
    suffix_at,
)

__all__ = [
    "id_checking_log_probs",
    "draft_log_probs",
    "bounded_bernoulli_log_probs",
    "bounded_bernoulli_marginals",
]

_NEG_INF = float("-inf")


def id_checking_log_probs(
    logits: torch.Tensor,
    total: torch.Tensor | int,
    b: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    max_total: int | None = None,
) -> torch.Tensor:
    """ID-checking Bernoulli steps ``log P(b_t | b_<t, k - r_{t-1})``, eq. (11).

    With ``r`` highs still to place before frame ``t``:
    ``P(b_t = 1 | r) = w_t C(r - 1, A_{t+1}^c) / C(r, A_t^c)``. The steps sum to
    ``ConditionalBernoulli.log_prob(b)`` (eq. 12). O(B * T * k) work (one suffix table).

    Args:
        logits: ``(*, T)`` log odds ``log w_t``.
        total: ``(*,)`` number of highs ``k``.
        b: ``(*sample, *, T)`` binary sequences.
        lengths: ``(*,)`` number of existing frames.
        max_total: a bound on every total that the caller knows: the tables are sized by it
            instead of by the largest total, which is then not read from the device.

    Returns:
        ``(*sample, *, T)``; 0 on padding frames, ``-inf`` from the step where ``b`` becomes
        impossible (wrong count, or a high in padding). Differentiable w.r.t. ``logits``.
    """
    args = broadcast_arguments(logits, total, lengths, max_total)
    tables = conditional_tables(args, prefix=False)
    T = args.logits.shape[-1]
    rows, row_index, shape = value_rows(b, args.batch_shape)  # (N, T)
    high = rows != 0
    # r before frame t: highs still to place; then after frame t.
    before = args.total[row_index].unsqueeze(-1) - (high.long().cumsum(-1) - high.long())
    after = before - high.long()
    frames = torch.arange(T, device=rows.device)
    rows_1 = row_index.unsqueeze(-1)  # (N,) -> (N, 1)
    current = suffix_at(tables.suffix, rows_1, frames, before)
    following = suffix_at(tables.suffix, rows_1, frames + 1, after)
    frame = torch.where(high, tables.log_on[row_index], tables.log_off[row_index])
    # ID-checking step, CB paper eq. (11) (and its complement for a low).
    step = log_ratio(frame + following, current)
    valid = tables.valid[row_index]
    step = torch.where(valid, step, torch.where(high, _NEG_INF, 0.0))
    return step.reshape(shape + (T,))


def bounded_bernoulli_log_probs(
    logits: torch.Tensor,
    total: torch.Tensor | int,
    times: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    max_total: int | None = None,
) -> torch.Tensor:
    """Bounded Bernoulli steps ``log P(t_l | t_{l-1}, k - l)``, eq. (13).

    ``P(t_l = t | t_{l-1}) = w_t C(k - l, A_t^c) / C(k - l + 1, A_{t_{l-1}}^c)`` for
    ``t > t_{l-1}``: the l-th high is drawn from the frames after the previous one. The steps
    sum to ``ConditionalBernoulli.log_prob`` (eq. 14). O(B * T * k) work.

    Args:
        logits: ``(*, T)`` log odds.
        total: ``(*,)`` number of highs ``k``.
        times: ``(*sample, *, K)`` int64 emission frames (0-based), increasing in ``l``, with
            ``K >= max(total)``. Entries ``l >= total`` are padding and may hold anything
            (the samplers put -1 there); ``K >= max_total`` where that is given.
        lengths: ``(*,)`` number of existing frames.
        max_total: a bound on every total that the caller knows: the tables are sized by it
            instead of by the largest total, which is then not read from the device.

    Returns:
        ``(*sample, *, K)``; 0 for ``l >= total``, ``-inf`` at an impossible step (not
        increasing, or outside ``[0, lengths)``). Differentiable w.r.t. ``logits``.
    """
    args = broadcast_arguments(logits, total, lengths, max_total)
    tables = conditional_tables(args, prefix=False)
    rows, row_index, shape = value_rows(times, args.batch_shape)  # (N, K)
    K = rows.shape[-1]
    if K < largest_total(args):
        bound = "the largest total" if max_total is None else f"max_total = {max_total}"
        raise ValueError(f"times has {K} entries per row, fewer than {bound}")
    total_n = tables.total[row_index].unsqueeze(-1)  # (N, 1)
    order = torch.arange(K, device=rows.device)
    active = order < total_n
    prev = F.pad(rows[:, :-1], (1, 0), value=-1)  # t_{l-1}, with t_{-1} = -1
    ok = active & (rows > prev) & (rows >= 0) & (rows < tables.lengths[row_index].unsqueeze(-1))
    at = torch.where(ok, rows, 0)
    prev = torch.where(ok, prev, -1)
    remaining = (total_n - 1 - order).clamp(min=0)  # highs after the l-th
    on = tables.log_on[row_index].gather(1, at)
    skipped = _skipped_log_off(tables, row_index, prev, at)
    rows_1 = row_index.unsqueeze(-1)
    following = suffix_at(tables.suffix, rows_1, at + 1, remaining)
    current = suffix_at(tables.suffix, rows_1, prev + 1, remaining + 1)
    # Bounded Bernoulli step, CB paper eq. (13).
    step = log_ratio(on + skipped + following, current)
    step = torch.where(active, torch.where(ok, step, _NEG_INF), 0.0)
    return step.reshape(shape + (K,))


def _skipped_log_off(tables: ConditionalTables, row_index, prev, at) -> torch.Tensor:
    """``sum_{prev < u < at} log(1 - p_u)``: the frames passed over between two highs, ``-inf``
    where one of them is always high. ``prev, at (N, L)`` -> ``(N, L)``."""
    sums = SkippedLogOff.of(tables.log_off).rows(row_index)  # (N, T + 1)
    return SkippedLogOff.between(sums.at(prev + 1), sums.at(at), tables.log_off.dtype)


def _log_marginals(tables: ConditionalTables) -> torch.Tensor:
    """``log P(t is the l-th draft | k)``, eq. (15), for ``l = 0..K-1`` (0-based) and every t.

    ``C(l, A_t) w_t C(k - 1 - l, A_{t+1}^c) / C(k, I)``: ``l`` highs before ``t``, ``k - 1 - l``
    after. Needs both tables; ``(B, K, T)`` with ``K = max(k)``; ``-inf`` for ``l >= k``.
    """
    T = tables.log_on.shape[-1]
    B, K = tables.log_on.shape[0], tables.prefix.shape[-1] - 1
    before = tables.prefix[:T, :, :K].permute(1, 2, 0)  # (T, B, K) -> (B, K, T)
    suffix = tables.suffix[1:].permute(1, 2, 0)  # (T, B, V) -> (B, V, T): highs after t
    after = tables.total.unsqueeze(-1) - 1 - torch.arange(K, device=suffix.device)  # (B, K)
    inside = (after >= 0).unsqueeze(-1)
    index = after.clamp(min=0).unsqueeze(-1).expand(B, K, T)
    after_t = torch.where(inside, suffix.gather(1, index), _NEG_INF)
    # Marginal Bounded Bernoulli probability, CB paper eq. (15).
    numerator = before + tables.log_on.unsqueeze(1) + after_t
    return log_ratio(numerator, tables.log_normaliser()[:, None, None])


def bounded_bernoulli_marginals(
    logits: torch.Tensor,
    total: torch.Tensor | int,
    lengths: torch.Tensor | None = None,
    log: bool = False,
    *,
    max_total: int | None = None,
) -> torch.Tensor:
    """``P(t is the l-th high | k)``, eq. (15), the marginal of the Bounded Bernoulli.

    Summing over ``l`` gives the inclusion probabilities ``P(B_t = 1 | k)`` (eq. 16, the
    ``mean`` of :class:`ConditionalBernoulli`); summing over ``t`` gives 1 for ``l < k``.
    O(B * T * k) work and memory.

    Args:
        logits: ``(*, T)`` log odds.
        total: ``(*,)`` number of highs ``k``.
        lengths: ``(*,)`` number of existing frames.
        log: return log probabilities (``-inf`` for zero) instead.
        max_total: a bound on every total that the caller knows: the tables are sized by it
            instead of by the largest total, which is then not read from the device.

    Returns:
        ``(*, K, T)`` with ``K = max(total)`` (``max_total`` where given; both at most ``T``);
        rows ``l >= total`` and padding frames are 0. Differentiable w.r.t. ``logits``.
    """
    args = broadcast_arguments(logits, total, lengths, max_total)
    marginals = _log_marginals(conditional_tables(args))
    if not log:
        marginals = torch.exp(marginals)
    return marginals.reshape(args.batch_shape + marginals.shape[1:])


def draft_log_probs(
    logits: torch.Tensor,
    total: torch.Tensor | int,
    drafts: torch.Tensor,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draft Bernoulli steps ``log P(t_j in A_j | A_{j-1}, k)``, eq. (9), in draw order.

    ``P(t_j | A_{j-1}) = w_{t_j} C(k - j, A_j^c) / ((k - j + 1) C(k - j + 1, A_{j-1}^c))``,
    where ``A_j^c`` is every frame not drafted yet. The steps sum to ``log P(A | k) - log k!``
    (eq. 10). The complement counts come from Vandermonde's identity (eq. 17):
    ``A_j^c = (I \\ A_k) + {t_{j+1}, ..., t_k}``, so one count over the undrafted frames and one
    over the draft suffixes give every step: O(N * (T + k) * k) work for N rows of drafts
    (each draft removes its own frames), T serial steps.

    Args:
        logits: ``(*, T)`` log odds.
        total: ``(*,)`` number of drafts ``k``.
        drafts: ``(*sample, *, K)`` int64 drafted frames in draw order, ``K >= max(total)``;
            entries ``j >= total`` are padding (may hold anything; the samplers put -1).
        lengths: ``(*,)`` number of existing frames.

    Returns:
        ``(*sample, *, K)``; 0 for ``j >= total``, ``-inf`` at an impossible step (a frame
        outside ``[0, lengths)`` or drafted twice). Differentiable w.r.t. ``logits``.
    """
    args = broadcast_arguments(logits, total, lengths)
    T = args.logits.shape[-1]
    rows, row_index, shape = value_rows(drafts, args.batch_shape)  # (N, K)
    K = rows.shape[-1]
    if K < largest_total(args):
        raise ValueError(f"drafts has {K} entries per row, fewer than the largest total")
    valid = frame_mask(args.lengths, T)
    tilt = tilt_for_total(args.logits, args.total, valid)
    log_off, log_on = bernoulli_log_weights(args.logits, valid, tilt)
    log_off, log_on = log_off[row_index], log_on[row_index]  # (N, T)
    total_n = args.total[row_index]
    ok, at = _valid_drafts(rows, total_n, args.lengths[row_index])
    undrafted = _undrafted_log_probs(log_off, log_on, ok, at, total_n, largest_total(args) + 1)
    # Draft step, CB paper eq. (9).
    j = torch.arange(K, device=rows.device)
    draws_left = (total_n.unsqueeze(-1) - j).clamp(min=1).to(log_on.dtype)  # k - j + 1 (1-based j)
    on_drawn = torch.where(ok, log_on.gather(1, at), _NEG_INF)
    step = log_ratio(on_drawn + undrafted[:, 1:], undrafted[:, :-1]) - torch.log(draws_left)
    active = j < total_n.unsqueeze(-1)
    step = torch.where(active, torch.where(ok, step, _NEG_INF), 0.0)
    return step.reshape(shape + (K,))


def _undrafted_log_probs(log_off, log_on, ok, at, total, num_states) -> torch.Tensor:
    """``log P(K_{A_j^c} = k - j)`` for ``j = 0..K``: the counts of every draft step at once.

    ``A_j^c`` (the frames not drafted after ``j`` draws) is the disjoint union of ``I \\ A_k``
    and the later drafts ``{t_{j+1}, ..., t_k}``, so by Vandermonde's identity (eq. 17) its PB
    is the convolution of the PB over ``I \\ A_k`` (one table) with that over the later drafts
    (a suffix table over the draws).

    Args:
        log_off, log_on: ``(N, T)`` tilted Bernoulli log-weights.
        ok: ``(N, K)`` valid drafts; at: ``(N, K)`` their frames (0 where not ok).
        total: ``(N,)``; num_states: ``V = max(total) + 1``.

    Returns:
        ``(N, K + 1)``.
    """
    N, T = log_on.shape
    K = ok.shape[-1]
    # log P(K = v) over the undrafted frames I \ A_k, v = 0..k.
    drafted = torch.zeros(N, T + 1, dtype=torch.bool, device=ok.device)
    drafted = drafted.scatter(1, torch.where(ok, at, T), True)[:, :T]  # invalid -> dummy T
    rest_off = torch.where(drafted, 0.0, log_off)  # drafted frames become identity steps
    rest_on = torch.where(drafted, _NEG_INF, log_on)
    rest = count_table(rest_off, rest_on, num_states)[T]  # (N, V)
    # log P(K = i) over the later drafts, j = 0..K: a suffix table over the draws.
    on_drawn = torch.where(ok, log_on.gather(1, at), _NEG_INF)
    off_drawn = torch.where(ok, log_off.gather(1, at), 0.0)
    later = count_table(off_drawn, on_drawn, num_states, suffix=True)  # (K + 1, N, V)
    later = later.transpose(0, 1)  # (K + 1, N, V) -> (N, K + 1, V)
    # Vandermonde's identity, eq. (17): sum_i P(i later drafts high) P(k - j - i in I \ A_k).
    j = torch.arange(K + 1, device=ok.device)
    index = total[:, None, None] - j[:, None] - torch.arange(num_states, device=ok.device)
    return log_sum_exp(later + gather_states(rest.unsqueeze(1), index), dim=-1)


def _valid_drafts(drafts, total, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, K)`` bool: draft ``j`` is active, inside ``[0, lengths)`` and not a repeat; and
    the drafts with invalid entries replaced by frame 0."""
    K = drafts.shape[-1]
    order = torch.arange(K, device=drafts.device)
    active = order < total.unsqueeze(-1)
    inside = active & (drafts >= 0) & (drafts < lengths.unsqueeze(-1))
    earlier = order.unsqueeze(-1) > order  # [j, j'] = j' < j
    same = drafts.unsqueeze(-1) == drafts.unsqueeze(-2)  # (N, K, K)
    repeat = (same & earlier & inside.unsqueeze(-2)).any(-1)
    ok = inside & ~repeat
    return ok, torch.where(ok, drafts, 0)
