"""One dispatch point per count-table operation (package-internal).

:func:`cbasr._backends.backend` names the backend of a tensor; here each operation that has a
compiled kernel (:mod:`cbasr.distributions._kernels`, numba on CPU) chooses between it and the
PyTorch reference (:mod:`cbasr.distributions._tables`). The reference imports no kernel and
the kernels import the reference, so the import graph has no cycle. Samplers dispatch in
:mod:`cbasr.distributions.samplers`, one point each.
"""

import torch

from cbasr import _backends
from cbasr.distributions import _kernels, _tables
from cbasr.distributions._arguments import Arguments, frame_mask, largest_total
from cbasr.distributions._tables import ConditionalTables

__all__: list[str] = []  # package-internal


def tilt_for_total(logits, total, valid):
    """:func:`cbasr.distributions._tables.tilt_for_total`: by safeguarded Newton steps in the
    compiled kernel (:func:`cbasr.distributions._kernels.tilt`) where the backend is numba, by
    the reference's bisection in one Triton program per row
    (:func:`cbasr.distributions._tables_triton.tilt`) where it is triton. ``valid`` is a
    frame mask (a prefix of each row)."""
    which = _backends.backend(logits) if logits.shape[-1] else "torch"
    if which == "numba":
        return _kernels.tilt(logits, total, valid.sum(-1))
    if which == "triton":
        from cbasr.distributions import _tables_triton

        return _tables_triton.tilt(logits, total, valid.sum(-1))
    return _tables.tilt_for_total(logits, total, valid)


def log_normaliser(log_off, log_on, total, lengths, num_states):
    """``log P(K = total)`` ``(B,)`` of the trials ``log_off``, ``log_on`` ``(B, T)`` with its
    gradient (eq. 16) from a kernel (numba on CPU, triton on CUDA) that keeps no table for the
    caller; None where the backend is torch or the dtype is not float32 / float64 (the caller
    reads the reference's prefix table)."""
    which = _backends.backend(log_on)
    if which == "numba":
        return _kernels.LogNormaliser.apply(log_off, log_on, total, lengths, num_states)
    if which == "triton" and log_on.dtype in (torch.float32, torch.float64):
        from cbasr.distributions import _tables_triton

        return _tables_triton.LogNormaliser.apply(log_off, log_on, total, lengths, num_states)
    return None


def _tilted_weights(args: Arguments):
    """The frame mask, the tilted ``log(1 - p_t), log p_t`` (:func:`tilt_for_total`) and the
    number of count states ``max(k) + 1`` of broadcast CB arguments."""
    T = args.logits.shape[-1]
    valid = frame_mask(args.lengths, T)
    tilt = tilt_for_total(args.logits, args.total, valid)
    log_off, log_on = _tables.bernoulli_log_weights(args.logits, valid, tilt)
    return valid, log_off, log_on, largest_total(args) + 1


def count_table(
    log_off: torch.Tensor, log_on: torch.Tensor, num_states: int, suffix: bool = False
) -> torch.Tensor:
    """:func:`cbasr.distributions._tables.count_table` (its arguments and table): one program
    per row of the Triton kernels (:class:`cbasr.distributions._tables_triton.CountTable`, the
    recursion and its adjoint) where the backend is triton and the dtype float32 or float64,
    the reference's ``T`` PyTorch steps each way elsewhere."""
    if _backends.backend(log_on) == "triton" and log_on.dtype in (torch.float32, torch.float64):
        from cbasr.distributions import _tables_triton

        off = log_off.transpose(0, 1).contiguous()  # (B, T) -> (T, B)
        on = log_on.transpose(0, 1).contiguous()
        return _tables_triton.CountTable.apply(off, on, num_states, suffix)
    return _tables.count_table(log_off, log_on, num_states, suffix)


def prefix_and_suffix_tables(
    log_off: torch.Tensor, log_on: torch.Tensor, num_states: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`cbasr.distributions._tables.prefix_and_suffix_tables`: on the triton backend two
    launches of :func:`count_table`'s kernels (a program per row each, side by side)."""
    if _backends.backend(log_on) == "triton" and log_on.dtype in (torch.float32, torch.float64):
        return count_table(log_off, log_on, num_states), count_table(
            log_off, log_on, num_states, suffix=True
        )
    return _tables.prefix_and_suffix_tables(log_off, log_on, num_states)


def conditional_tables(
    args: Arguments, prefix: bool = True, suffix: bool = True
) -> ConditionalTables:
    """Tilted prefix and suffix tables for broadcast CB arguments (see
    :class:`cbasr.distributions._tables.ConditionalTables`).

    O(B * T * max(k)) work and memory, T serial steps per table.
    """
    valid, log_off, log_on, num_states = _tilted_weights(args)
    if prefix and suffix:
        prefix_table, suffix_table = prefix_and_suffix_tables(log_off, log_on, num_states)
    else:
        prefix_table = count_table(log_off, log_on, num_states) if prefix else None
        suffix_table = count_table(log_off, log_on, num_states, suffix=True) if suffix else None
    return ConditionalTables(
        log_off, log_on, prefix_table, suffix_table, args.total, args.lengths, valid
    )


def conditional_normaliser(args: Arguments) -> ConditionalTables:
    """The per-frame tilted weights and ``log P(K = k)`` alone (what ``log_prob`` needs).

    A kernel computes the normaliser and its gradient (eq. 16) where the backend has one
    (:func:`log_normaliser`); elsewhere it is read from the reference's prefix table, which is
    kept.
    """
    valid, log_off, log_on, num_states = _tilted_weights(args)
    normaliser = log_normaliser(log_off, log_on, args.total, args.lengths, num_states)
    if normaliser is None:
        prefix = count_table(log_off, log_on, num_states)
        return ConditionalTables(log_off, log_on, prefix, None, args.total, args.lengths, valid)
    return ConditionalTables(
        log_off, log_on, None, None, args.total, args.lengths, valid, normaliser
    )


def log_prob_of_rows(tables: ConditionalTables, rows: torch.Tensor) -> torch.Tensor:
    """``log P(b | k)`` (eq. 4) of value rows ``(S B, T)`` (row ``m`` of parameter row ``m %
    B``) -> ``(S, B)``, from the tilted weights and normaliser of
    :func:`conditional_normaliser` and the rows' sums of log weights (eq. 6); ``-inf`` for a
    row without exactly ``total`` highs."""
    # Row n belongs to parameter row n % B: as (S, B, T) the parameters broadcast, so their
    # gradient is a sum over samples rather than an indexed accumulation.
    B, T = tables.log_on.shape
    high = rows.view(rows.shape[0] // max(B, 1), B, T) != 0
    frames = torch.where(high, tables.log_on, tables.log_off).sum(-1)  # (S, B)
    normaliser = tables.log_normaliser()
    log_prob = torch.where(normaliser == float("-inf"), float("-inf"), frames - normaliser)
    return torch.where(high.sum(-1) == tables.total, log_prob, float("-inf"))


def fused_log_prob(args: Arguments, rows: torch.Tensor):
    """``(log P(b | k) (S B,), codes (S B,))`` of value rows ``(S B, T)`` by one Triton kernel
    each way (:class:`cbasr.distributions._tables_triton.LogProb`: the codes say what is wrong
    with a row) where the backend is triton and the dtype float32 or float64; None elsewhere
    (the caller runs :func:`log_prob_of_rows`)."""
    logits = args.logits
    if _backends.backend(logits) != "triton" or logits.dtype not in (torch.float32, torch.float64):
        return None
    if rows.dim() != 2 or rows.shape[-1] != logits.shape[-1]:  # (the caller checks values)
        raise ValueError(f"value rows of {logits.shape[-1]} frames expected, got {rows.shape}")
    from cbasr.distributions import _tables_triton

    def reference(x):  # the same log probabilities, differentiable twice (double backward)
        return log_prob_of_rows(conditional_normaliser(args._replace(logits=x)), rows).reshape(-1)

    num_states = largest_total(args) + 1
    return _tables_triton.LogProb.apply(
        logits, args.total, args.lengths, rows, num_states, reference
    )
