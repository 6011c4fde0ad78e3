"""Argument checks shared by the distributions, losses and estimators.

Every message names the offending argument. A check that reads tensor values (lengths, label
ids) synchronises with the device to read them, once per check, or once per :func:`one_read`
block for all the checks made inside it; callers run them once per batch.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence

import torch

__all__ = [
    "check_shape",
    "check_range",
    "check_lengths",
    "check_label_ids",
    "check_floating",
    "check_that",
    "check_none",
    "check_at_least",
    "one_read",
    "read",
    "graph_capturing",
    "graph_step",
    "in_graph_step",
]

# The value checks of the enclosing one_read block (None outside one), per thread: each queued
# check is its 0-d statistics, their test on the host, and the check itself (which raises)
_queue: contextvars.ContextVar[
    list[tuple[list[torch.Tensor], Callable[[list], bool], Callable[[], None]]] | None
] = contextvars.ContextVar("cbasr_checks_queue", default=None)


@contextlib.contextmanager
def one_read() -> Iterator[None]:
    """Read the tensor values that the checks made in the block need with one copy to the host.

    :func:`check_range`, :func:`check_lengths`, :func:`check_label_ids` and :func:`check_that`
    each read tensor values, which for a CUDA tensor waits for the device: inside a loss, one
    wait per check, while the host cannot queue the next kernels. Inside this block they only
    queue the reductions they need (a minimum and a maximum, say); the end of the block reads
    all of them with one copy per device and raises, if a check fails, that check's own error:
    the first failing one in the order made (an error that needs no tensor values, a wrong shape
    say, is raised at once, before them). A block inside another leaves the reading to the
    outer one. The code in the block must not use the values it checks: an out-of-range index
    would fail on the device first, without the message; nor call a function that computes on
    values it checks in a block of its own, which leaves the reading to this one. A value that
    the code must read anyway, read by :func:`read`, carries the checks queued before it.

    While the current CUDA stream captures a graph (:func:`graph_capturing`: the training step
    of ``trainer.cuda_graphs``), the block reads nothing and checks nothing: a graph's replays
    cannot stop for the host. That step is captured on a batch these checks have passed (its
    first, run eagerly), and its replays take batches of the same dataset, which has already
    skipped every utterance with a label outside the vocabulary or more labels than frames.
    """
    if _queue.get() is not None:
        yield
        return
    token = _queue.set([])
    try:
        yield
        queued = _queue.get()
    finally:
        _queue.reset(token)
    if graph_capturing():
        return
    _run(queued, _copy([stats for stats, _, _ in queued]))


def read(*values: torch.Tensor) -> list:
    """The values of the 0-d tensors ``values`` as Python numbers (floats where their dtypes
    mix a floating one with others), with one copy to the host per device.

    Inside a :func:`one_read` block the copy also carries the value checks queued in the block
    so far, which it then runs: the first failing one raises its error, before any value is
    returned, and the block's end reads only what is queued after it. So a value the code must
    read anyway (a size to allocate, a path to choose) costs the block no read of its own.
    """
    queued = _queue.get()
    pending = list(queued or ())
    if queued:
        queued.clear()
    *checked, got = _copy([stats for stats, _, _ in pending] + [list(values)])
    token = _queue.set(None)  # a failing check raises its own error at once, as after a block
    try:
        _run(pending, checked)
    finally:
        _queue.reset(token)
    return got


def _copy(groups: list[list[torch.Tensor]]) -> list[list]:
    """The values of groups of 0-d tensors, with one copy per device for all of them."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for group in groups:
        for x in group:
            by_device.setdefault(x.device, []).append(x)
    copied = {device: iter(_read(xs)) for device, xs in by_device.items()}
    return [[next(copied[x.device]) for x in group] for group in groups]


def _run(queued, values: list[list]) -> None:
    """Raise the error of the first queued check that its values fail."""
    for (_, ok, check), got in zip(queued, values, strict=True):
        if not ok(got):
            check()  # raises the check's own error
            raise AssertionError(f"one_read: a deferred check failed but {check} did not raise")


_graph_step: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cbasr_graph_step", default=False
)


@contextlib.contextmanager
def graph_step() -> Iterator[None]:
    """A step of ``trainer.cuda_graphs`` (its first run, eager, and its capture): the code in
    it takes the paths a CUDA graph can hold (:func:`in_graph_step`), the same in both."""
    token = _graph_step.set(True)
    try:
        yield
    finally:
        _graph_step.reset(token)


def in_graph_step() -> bool:
    """Inside :func:`graph_step`: take the path that reads nothing on the host (the recurrent
    encoders' per-direction stack, not a packed batch; the CTC loss's Triton kernels, not
    torch's CUDA ``ctc_loss``)."""
    return _graph_step.get()


def graph_capturing() -> bool:
    """Whether the current CUDA stream is capturing a CUDA graph, where reading a device value
    on the host is an error (and packing sequences by their lengths is one)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _read(stats: list[torch.Tensor]) -> list:
    """The values of 0-d tensors on one device, with one copy to the host (in float64 where a
    floating dtype meets another: a stack would round integers to the narrowest float)."""
    if len(stats) == 1:  # (no stack to launch)
        return [stats[0].item()]
    if len({x.dtype for x in stats}) > 1 and any(x.is_floating_point() for x in stats):
        stats = [x.double() for x in stats]
    return torch.stack(stats).tolist()


def _deferred() -> bool:
    """Whether a value check goes to the enclosing :func:`one_read` block."""
    return _queue.get() is not None


def _defer(stats: list[torch.Tensor], ok: Callable[[list], bool], check: Callable[[], None]):
    """Queue a value check in the enclosing :func:`one_read` block: ``ok(values of stats)``
    tells whether it passes, ``check()`` raises its error."""
    _queue.get().append((stats, ok, check))


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


def check_that(ok: torch.Tensor, fail: Callable[[], None]) -> None:
    """Call ``fail``, which raises the caller's error, unless every entry of the boolean
    tensor ``ok`` is true; at the end of the enclosing :func:`one_read` block, if any."""
    if _deferred():
        if ok.numel():
            _defer([ok.all()], lambda v: bool(v[0]), fail)
        return
    if not bool(ok.all()):
        fail()
        raise AssertionError(f"check_that: {fail} did not raise")


def check_none(bad: torch.Tensor, fail: Callable[[], None]) -> None:
    """Call ``fail``, which raises the caller's error, if any entry of the boolean tensor
    ``bad`` is true (one reduction where :func:`check_that` of its negation takes two); at the
    end of the enclosing :func:`one_read` block, if any."""
    if not bad.numel():
        return
    found = bad.any()
    if _deferred():
        _defer([found], lambda v: not v[0], fail)
        return
    if bool(found):
        fail()
        raise AssertionError(f"check_none: {fail} did not raise")


def check_at_least(values: torch.Tensor, low: int | float, fail: Callable[[], None]) -> None:
    """Call ``fail``, which raises the caller's error, unless every entry of ``values`` is at
    least ``low`` (one reduction, a minimum); at the end of the enclosing :func:`one_read`
    block, if any. NaN fails."""
    if not values.numel():
        return
    least = values.amin() if values.dim() else values
    if _deferred():
        _defer([least], lambda v: v[0] >= low, fail)
        return
    if not least.item() >= low:
        fail()
        raise AssertionError(f"check_at_least: {fail} did not raise")


def check_range(name: str, values: torch.Tensor, low: int, high: int) -> None:
    """Raise ``ValueError`` unless every entry of ``values`` (any shape) lies in ``[low, high]``.

    The message gives the first offending (flattened) index and up to ten of them.
    """
    if _deferred() and not values.is_floating_point():  # (floats, NaN: checked at once)
        if values.numel():
            _defer(
                list(torch.aminmax(values)),
                lambda v: low <= v[0] and v[1] <= high,
                lambda: check_range(name, values, low, high),
            )
        return
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
    if _deferred() and num_classes > 0:  # (padding reads as id 0, which must be valid)
        if targets.numel():
            stats = list(torch.aminmax(torch.where(valid, targets, 0)))
            if blank is not None:
                stats.append((valid & (targets == blank)).any())
            _defer(
                stats,
                lambda v: v[0] >= 0 and v[1] < num_classes and not any(v[2:]),
                lambda: check_label_ids(name, targets, target_lengths, num_classes, blank),
            )
        return
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
