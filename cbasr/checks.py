"""Argument checks shared by the distributions, losses and estimators.

Every message names the offending argument. Each check that reads tensor values (lengths, label
ids) synchronises with the device once; callers run them once per batch.
"""

from collections.abc import Sequence

import torch

__all__ = ["check_shape", "check_range", "check_lengths", "check_label_ids", "check_floating"]


def check_floating(name: str, x: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``x`` is a floating-point tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor; got dtype {x.dtype}")


def check_shape(name: str, x: torch.Tensor, dims: str, expected: Sequence[int | None]) -> None:
    """Raise ``ValueError`` unless ``x.shape`` matches ``expected`` (``None`` matches any size).

    Args:
        name: the argument's name, used in the message.
        x: tensor to check.
        dims: the documented shape, e.g. ``"(B, T, L)"``.
        expected: one entry per dimension; ``None`` where any size is allowed.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    ok = x.dim() == len(expected) and all(e is None or s == e for s, e in zip(x.shape, expected))
    if not ok:
        want = tuple("*" if e is None else e for e in expected)
        raise ValueError(f"{name} must have shape {dims} = {want}; got {tuple(x.shape)}")


def check_lengths(
    name: str, lengths: torch.Tensor, batch: int, max_len: int, min_len: int = 0
) -> None:
    """Raise ``ValueError`` unless ``lengths`` is ``(B,)`` integers in ``[min_len, max_len]``.

    Args:
        name: the argument's name, used in the message.
        lengths: ``(B,)`` integer tensor.
        batch: expected ``B``.
        max_len: the padded size the lengths index into.
        min_len: smallest allowed length.
    """
    check_shape(name, lengths, "(B,)", (batch,))
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers; got dtype {lengths.dtype}")
    check_range(name, lengths, min_len, max_len)


def check_range(name: str, values: torch.Tensor, low: int, high: int) -> None:
    """Raise ``ValueError`` unless every entry of ``values`` (any shape) lies in ``[low, high]``.

    The message gives the first offending (flattened) index and up to ten of them.
    """
    flat = values.reshape(-1)
    bad = ((flat < low) | (flat > high)).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        where = f"{name}[{i}]" if values.dim() == 1 else f"{name} (flattened index {i})"
        raise ValueError(
            f"{where} = {int(flat[i])} is outside [{low}, {high}] "
            f"(indices out of range: {bad[:10]})"
        )


def check_label_ids(
    name: str,
    targets: torch.Tensor,
    target_lengths: torch.Tensor,
    num_classes: int,
    blank: int | None = None,
) -> None:
    """Raise ``ValueError`` if a valid (unpadded) label id is outside ``[0, num_classes)``.

    Args:
        name: the argument's name, used in the message.
        targets: ``(B, U)`` integer label ids; entries at ``u >= target_lengths[b]`` are padding
            and are not checked.
        target_lengths: ``(B,)`` valid labels per utterance.
        num_classes: size of the vocabulary the ids index.
        blank: if given, a valid label equal to ``blank`` is also an error.
    """
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer label ids; got dtype {targets.dtype}")
    positions = torch.arange(targets.shape[1], device=targets.device)
    valid = positions[None, :] < target_lengths.to(targets.device)[:, None]  # (B, U)
    bad = valid & ((targets < 0) | (targets >= num_classes))
    if blank is not None:
        bad = bad | (valid & (targets == blank))
    hits = bad.nonzero()
    if hits.numel():
        b, u = (int(v) for v in hits[0])
        rule = f"[0, {num_classes})" + ("" if blank is None else f" and != blank ({blank})")
        raise ValueError(
            f"{name}[{b}, {u}] = {int(targets[b, u])} must be in {rule} "
            f"({hits.shape[0]} bad label ids in all)"
        )
