"""Argument handling shared by the Conditional Bernoulli functions.

Every public function takes ``logits (*, T)`` with an optional ``total (*,)`` and
``lengths (*,)``. They are broadcast to one batch shape here and flattened to ``B`` rows, so
the algorithms see ``(B, T)`` tensors only. Values with extra leading (sample) dimensions are
flattened to ``N = S * B`` rows with ``row_index (N,)`` pointing at their parameter row.
"""

from typing import NamedTuple

import torch

from cbasr.checks import check_at_least, check_none, check_that

__all__: list[str] = []  # private helpers only


class Arguments(NamedTuple):
    """Broadcast and flattened arguments.

    Attributes:
        logits: ``(B, T)``.
        total: ``(B,)`` int64, or None when the function has no total.
        lengths: ``(B,)`` int64; ``T`` where no lengths were given.
        batch_shape: the broadcast batch shape ``*`` with ``prod(*) == B``.
        max_total: the caller's bound on ``total`` (:func:`largest_total`), or None.
    """

    logits: torch.Tensor
    total: torch.Tensor | None
    lengths: torch.Tensor
    batch_shape: torch.Size
    max_total: int | None = None


def broadcast_arguments(
    logits: torch.Tensor,
    total: torch.Tensor | int | None = None,
    lengths: torch.Tensor | int | None = None,
    max_total: int | None = None,
) -> Arguments:
    """Broadcast ``logits (*, T)``, ``total (*,)`` and ``lengths (*,)`` and flatten the batch.

    ``max_total``, where the caller knows one (the columns of its rewards, say), bounds every
    total: the tables are sized by it instead of by the largest total, which would be read from
    the device. A total above it is an error (checked with :func:`cbasr.checks.check_none`: in
    an enclosing :func:`cbasr.checks.one_read` block, with the block's read, the total computed
    on meanwhile as ``max_total``, so that no table is indexed past its end).
    """
    if logits.dim() < 1:
        raise ValueError("logits must have a frame dimension: shape (*, T)")
    T = logits.shape[-1]
    device = logits.device
    shapes = [logits.shape[:-1]]
    if total is not None:
        total = torch.as_tensor(total, device=device)
        shapes.append(total.shape)
    if lengths is not None:
        lengths = torch.as_tensor(lengths, device=device)
        shapes.append(lengths.shape)
    batch_shape = torch.broadcast_shapes(*shapes)
    logits = logits.expand(batch_shape + (T,)).reshape(batch_shape.numel(), T)  # (*, T) -> (B, T)
    if total is not None:
        total = total.expand(batch_shape).reshape(-1).long()  # (*,) -> (B,)
    if lengths is None:
        lengths = torch.full((logits.shape[0],), T, dtype=torch.long, device=device)
    else:
        lengths = lengths.expand(batch_shape).reshape(-1).long()  # (*,) -> (B,)
    if max_total is not None:
        if total is None or isinstance(max_total, bool) or not isinstance(max_total, int):
            raise ValueError(f"max_total must be an int bounding a total; got {max_total!r}")
        if max_total < 0:
            raise ValueError(f"max_total must be at least 0; got {max_total}")
        given, over = total, total > max_total

        def above():
            b = int(over.nonzero()[0, 0])
            raise ValueError(
                f"total[{b}] = {int(given[b])} > max_total = {max_total}, the bound the caller "
                "gave for every total (flattened batch index)"
            )

        check_none(over, above)
        total = total.clamp(max=max_total)  # no table indexed past its end
    return Arguments(logits, total, lengths, batch_shape, max_total)


def frame_mask(lengths: torch.Tensor, num_frames: int) -> torch.Tensor:
    """``(B,)`` lengths -> ``(B, T)`` bool, True on frames that exist (``t < lengths``)."""
    frames = torch.arange(num_frames, device=lengths.device)
    return frames < lengths.unsqueeze(-1)


def flat_values(value: torch.Tensor, batch_shape: torch.Size) -> tuple[torch.Tensor, torch.Size]:
    """Flatten a value ``(*sample, *batch, E)`` to rows ``(N, E)``: row ``n`` belongs to
    parameter row ``n % B``.

    ``value`` must broadcast against the parameters' batch shape, with any extra leading
    dimensions being sample dimensions.

    Returns:
        ``(N, E)`` value rows and the value's full batch shape ``(*sample, *batch)``.
    """
    event = value.shape[-1:]
    full = torch.broadcast_shapes(value.shape[:-1], batch_shape)
    if full[len(full) - len(batch_shape) :] != batch_shape:
        raise ValueError(
            f"value batch shape {tuple(value.shape[:-1])} does not end with the parameters' "
            f"batch shape {tuple(batch_shape)}"
        )
    # (*sample, *batch, E) -> (N, E)
    return value.expand(full + event).reshape(full.numel(), event[0]), full


def value_rows(
    value: torch.Tensor, batch_shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor, torch.Size]:
    """:func:`flat_values` with the ``(N,)`` int64 index of each row's parameter row.

    Returns:
        ``(N, E)`` value rows, ``(N,)`` their parameter rows, and the value's full batch shape
        ``(*sample, *batch)``.
    """
    rows, full = flat_values(value, batch_shape)
    num_params = batch_shape.numel()
    row_index = torch.arange(rows.shape[0], device=value.device) % max(num_params, 1)
    return rows, row_index, full


def constraint_error(distribution, name: str, value: torch.Tensor):
    """A function that raises the ValueError torch raises when ``distribution``'s argument
    ``name`` (``value``) breaks its constraint in ``arg_constraints``."""
    constraint = distribution.arg_constraints[name]

    def fail():
        raise ValueError(
            f"Expected parameter {name} ({type(value).__name__} of shape "
            f"{tuple(value.shape)}) of distribution {distribution!r} to satisfy the "
            f"constraint {constraint!r}, but found invalid values:\n{value}"
        )

    return fail


def check_arguments(distribution) -> None:
    """torch's checks of a distribution's ``arg_constraints``, each error as torch words it,
    made with :func:`~cbasr.checks.check_that` (torch reads the device once per argument; in
    a :func:`~cbasr.checks.one_read` block these share its read). The distribution is
    constructed with ``validate_args=False`` for torch, and calls this when it validates."""
    for name, constraint in distribution.arg_constraints.items():
        value = getattr(distribution, name)
        check_that(constraint.check(value), constraint_error(distribution, name, value))


def check_total(total: torch.Tensor, lengths: torch.Tensor) -> None:
    """Raise ValueError unless ``0 <= total <= lengths`` (room for every high): one reduction
    to read, of ``min(total, lengths - total)``."""

    def fail():
        bad = (total < 0) | (total > lengths)
        index = int(bad.nonzero()[0, 0])
        raise ValueError(
            "total (number of highs) must satisfy 0 <= total <= lengths; got "
            f"total={int(total[index])} with lengths={int(lengths[index])} at (flattened) "
            f"batch index {index}"
        )

    check_at_least(torch.minimum(total, lengths - total), 0, fail)


def largest_total(args: Arguments) -> int:
    """The largest total in the batch, clamped to ``[0, T]``: the caller's bound
    ``args.max_total`` where it gave one, else read from the device."""
    num_frames = args.logits.shape[-1]
    if args.max_total is not None:
        return min(args.max_total, num_frames)
    if args.total.numel() == 0:
        return 0
    return min(max(int(args.total.max()), 0), num_frames)
