"""Pruned transducer losses: the full joint only where the alignment can plausibly be.

Kuang, Guo, Kang, Lin, Luo, Yao and Povey (2022), "Pruned RNN-T for fast, memory-efficient ASR
training", arXiv:2206.13236. The RNN-T lattice (:mod:`cbasr.losses.transducer`) has ``T (U + 1)``
nodes, and a transducer's cost is its joint network evaluated at every one of them. The
pruned loss evaluates it at ``S`` label positions per frame instead:

1. A *trivial joint*, ``am_t + lm_u`` with ``am = W_a f_t``, ``lm = W_l g_u`` linear in the
   encoder and prediction outputs, gives the whole lattice's edge weights for the cost of a
   ``(T, V) x (V, U + 1)`` matrix product: its normaliser ``log sum_v exp(am_t[v] + lm_u[v])``
   factors (:func:`trivial_joint_log_probs`). Its loss (the *simple* loss) trains ``W_a``,
   ``W_l`` and, through them, the encoder.
2. The simple lattice's node occupancies (its edge posteriors) choose, for each frame ``t``,
   the window ``[s_t, s_t + S)`` of label positions holding the most of them, adjusted so
   that the windows hold a path (:func:`prune_ranges`).
3. The model's joint is evaluated on the windows only (``(B, T, S, V)`` instead of
   ``(B, T, U + 1, V)``), and :func:`pruned_transducer_nll` sums the lattice over the paths
   that stay inside them.

**Exactness statement.** :func:`pruned_transducer_nll` is exact for what it computes: minus
the log of the summed probability of the lattice paths whose every node lies in the windows,
with its exact gradient, the windows held fixed (they are chosen from detached posteriors and
are not differentiated). It is therefore an upper bound of the full negative log-likelihood,
equal to it when every window covers all label positions (``S >= U_b + 1``), and as close as
the paths outside the windows are improbable. The windows always hold at least one path
(:func:`prune_ranges`), so the bound is finite whenever the joint's probabilities are nonzero.

The one-label-per-frame topology (``monotonic=True``, :mod:`cbasr.losses.transducer`) is
served too, as in k2's pruned loss for its "modified" transducer: a path rises by at most one
label position per frame there, so the windows may rise by at most one per frame.

Both criteria are served: ``hat=False`` is RNN-T (one softmax over the ``V`` units, blank
unit 0); ``hat=True`` is HAT (HAT paper eq. 4: a blank Bernoulli from unit 0's logit and a
softmax over units ``1 .. V - 1``). Label ``y`` is unit ``y`` in both: ``targets`` hold unit
indices ``>= 1``.
"""

import torch
import torch.nn.functional as F

from cbasr import _backends
from cbasr.checks import (
    check_floating,
    check_lengths,
    check_shape,
    check_that,
    one_read,
)
from cbasr.losses._joint import _fused_joint, fused_joint_nll, gather_logsumexp
from cbasr.losses.transducer import _check_fastemit, _lattice_nll
from cbasr.losses.trivial_joint import (
    _check_joint_sides,
    _check_labels,
    _edges,
    _trivial_joint,
    label_columns,
    trivial_joint_log_probs,
)

__all__ = [
    "trivial_joint_log_probs",  # step 1, from cbasr.losses.trivial_joint
    "prune_ranges",
    "simple_transducer_nll",
    "pruned_transducer_nll",
]

_NEG_INF = float("-inf")


def prune_ranges(
    occupancy: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    prune_range: int,
    monotonic: bool = False,
) -> torch.Tensor:
    """Window starts ``s_t``: per frame the ``prune_range`` (``S``) label positions
    ``[s_t, s_t + S)`` with the most occupancy, adjusted to hold a path.

    A path from ``(0, 0)`` to ``(T_b - 1, U_b)`` inside the windows exists when ``s_0 = 0``,
    ``s_{t-1} <= s_t <= s_{t-1} + S - 1`` (a frame's windows overlap, so the path can step
    to the next frame from where it is) and ``s_{T_b - 1} >= U_b - S + 1`` (the last window
    holds ``U_b``). Each ``s_t`` is first clamped to what these allow at frame ``t``
    (``[U_b - S + 1 - (T_b - 1 - t)(S - 1), t (S - 1)]``, and ``<= U_b - S + 1``), then made
    non-decreasing by a running maximum, then made to rise by at most ``S - 1`` per frame by
    raising earlier starts (a running maximum of ``s_t - t (S - 1)`` from the end); neither
    step leaves the clamped bounds.

    In the one-label-per-frame lattice (``monotonic``) a path at ``(t, u)`` goes on to
    ``(t + 1, u)`` or ``(t + 1, u + 1)`` and ends at ``(T_b, U_b)`` from the last frame's node
    ``U_b - 1`` or ``U_b``. The same construction holds a path with a rise of at most 1 per
    frame in place of ``S - 1``, and bounds ``[U_b - S + 1 - (T_b - t), t]`` (a path at frame
    ``t`` has emitted at most ``t`` labels and must emit the rest on the ``T_b - t`` frames
    left): the windows' lowest positions then form such a path, and the last window holds
    ``U_b - 1`` or ``U_b``.

    Args:
        occupancy: ``(B, T, U + 1)`` nonnegative weight of each node, e.g. the summed
            posteriors of the edges leaving it; detached.
        input_lengths, target_lengths: ``(B,)``.
        prune_range: ``S >= 2``.
        monotonic: windows for the one-label-per-frame lattice.

    Returns:
        ``(B, T)`` int64 starts; frames past ``T_b`` repeat the last frame's bounds.

    Raises:
        ValueError: if an utterance has more labels than the windows can hold,
            ``U_b > T_b (S - 1)`` (``U_b > T_b`` when ``monotonic``).
    """
    check_shape("occupancy", occupancy, "(B, T, U + 1)", (None, None, None))
    B, T, U1 = occupancy.shape
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T, min_len=1)
        check_lengths("target_lengths", target_lengths, B, U1 - 1)
        _check_windows(input_lengths, target_lengths, prune_range, monotonic)
    return _prune_ranges(occupancy, input_lengths, target_lengths, prune_range, monotonic)


def _check_windows(input_lengths, target_lengths, prune_range: int, monotonic: bool) -> None:
    """``prune_range >= 2``, and windows that can hold each utterance's labels."""
    if prune_range < 2:
        raise ValueError(f"prune_range must be >= 2, got {prune_range}")
    S = prune_range
    rise = 1 if monotonic else S - 1  # the most label positions a path climbs per frame
    T_b, U_b = input_lengths.long(), target_lengths.to(input_lengths.device).long()
    fits = U_b <= T_b * rise

    def fail():
        b = int((~fits).nonzero()[0, 0])
        why = (
            "the one-label-per-frame lattice emits at most 1 label per frame"
            if monotonic
            else f"windows of prune_range={S} label positions hold at most {S - 1} labels per frame"
        )
        raise ValueError(
            f"utterance {b} of the batch has {int(U_b[b])} labels in {int(T_b[b])} frames: " + why
        )

    check_that(fits, fail)


def _prune_ranges(occupancy, input_lengths, target_lengths, prune_range, monotonic):
    """:func:`prune_ranges` on arguments already checked."""
    B, T, U1 = occupancy.shape
    S, device = prune_range, occupancy.device
    T_b = input_lengths.to(device)[:, None]  # (B, 1)
    U_b = target_lengths.to(device)[:, None]
    rise = 1 if monotonic else S - 1  # the most label positions a path climbs per frame
    if U1 > S:  # the window holding the most occupancy, by differences of a running sum
        sums = F.pad(occupancy.detach().double().cumsum(dim=-1), (1, 0))
        desired = (sums[..., S:] - sums[..., :-S]).argmax(dim=-1)  # (B, T)
    else:
        desired = torch.zeros(B, T, dtype=torch.long, device=device)
    t = torch.arange(T, device=device)[None, :].expand(B, T)
    last = torch.minimum(t, T_b - 1)  # padded frames take the last frame's bounds
    top = (U_b - S + 1).clamp(min=0)
    frames_left = T_b - last if monotonic else T_b - 1 - last
    low = (top - frames_left * rise).clamp(min=0)
    high = torch.minimum(last * rise, top)
    starts = torch.maximum(torch.minimum(desired, high), low)
    starts = starts.cummax(dim=1).values
    climb = t * rise
    return (starts - climb).flip(1).cummax(dim=1).values.flip(1) + climb


def simple_transducer_nll(
    am: torch.Tensor,
    lm: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    prune_range: int,
    hat: bool = False,
    monotonic: bool = False,
    *,
    values_checked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trivial joint's loss (steps 1 and 2 of the module docstring) and the windows it
    chooses.

    The lattice runs once, on detached edge weights, for both: its gradient is the edge
    posteriors, whose per-node sums are the occupancies :func:`prune_ranges` reads, and the
    returned loss is ``nll + sum(grad * w) - sum(grad * w).detach()`` over the attached edge
    weights ``w``: the lattice's value with the lattice's gradient.

    Args:
        am, lm, targets, target_lengths, hat: as :func:`trivial_joint_log_probs`.
        input_lengths: ``(B,)`` frames.
        prune_range: ``S``, as :func:`prune_ranges`.
        monotonic: the one-label-per-frame lattice, for the loss and the windows.
        values_checked: the lengths, label ids and windows were checked already on the same
            ``targets``, lengths, ``T``, vocabulary and ``prune_range`` (the dual-mode model's
            full-context pass, after its chunked one): their values are not read again (the
            shapes still are).

    Returns:
        ``nll (B,)``, differentiable once w.r.t. ``am`` and ``lm``, and ``starts (B, T)``.
        The lattice runs in the two sides' common dtype, float32 where that is a half
        precision (under autocast: the pruned loss sums in float32 too); the gradients are
        each side's own dtype.
    """
    _check_joint_sides(am, lm, targets)
    B, T, V = am.shape
    U1 = lm.shape[1]
    if not values_checked:
        with one_read():
            check_lengths("input_lengths", input_lengths, B, T, min_len=1)
            _check_labels(targets, target_lengths, V)
            _check_windows(input_lengths, target_lengths, prune_range, monotonic)
    dtype = _sum_dtype(am, lm)
    am, lm = am.to(dtype), lm.to(dtype)
    if _fused_simple(am, lm):  # the Triton kernels: edges, lattice, windows in four launches
        from cbasr.losses import _pruned_triton

        device = am.device
        return _pruned_triton.SimpleLoss.apply(
            am, lm, targets.to(device).long(), input_lengths.to(device).long(),
            target_lengths.to(device).long(), prune_range, hat, monotonic,
        )  # fmt: skip
    # padded frames and label positions zeroed first: whatever they hold (NaN) stays out of
    # the normaliser's product and its gradient
    frames = torch.arange(T, device=am.device)[None, :] < input_lengths.to(am.device)[:, None]
    positions = torch.arange(U1, device=lm.device)[None, :] <= target_lengths.to(lm.device)[:, None]
    am = torch.where(frames[..., None], am, 0.0)
    lm = torch.where(positions[..., None], lm, 0.0)
    blank_lp, emit_lp = _trivial_joint(am, lm, targets, target_lengths, hat)
    with torch.enable_grad():
        blank_d = blank_lp.detach().requires_grad_()
        emit_d = emit_lp.detach().requires_grad_()
        nll = _lattice_nll(blank_d, emit_d, input_lengths, target_lengths, monotonic, 0.0)
        grad_blank, grad_emit = torch.autograd.grad(nll.sum(), (blank_d, emit_d))
    # gradients of -log P: minus the posteriors of the edges leaving each node
    occupancy = -(grad_blank + F.pad(grad_emit, (0, 1)))
    starts = _prune_ranges(occupancy, input_lengths, target_lengths, prune_range, monotonic)
    linear = (grad_blank * blank_lp).sum(dim=(1, 2)) + (grad_emit * emit_lp).sum(dim=(1, 2))
    return nll.detach() + linear - linear.detach(), starts


def _sum_dtype(am: torch.Tensor, lm: torch.Tensor) -> torch.dtype:
    """The simple loss's dtype: the sides' common one, float32 for half precisions (a
    lattice summed in bfloat16 loses the loss's digits, and its Triton kernels take float32
    and float64 only)."""
    dtype = torch.promote_types(am.dtype, lm.dtype)
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _fused_simple(am: torch.Tensor, lm: torch.Tensor) -> bool:
    """Whether :class:`cbasr.losses._pruned_triton.SimpleLoss` takes the simple loss (of sides
    already in :func:`_sum_dtype`: float32 or float64): the Triton backend, one device."""
    return _backends.backend(am) == "triton" and lm.device == am.device


def pruned_transducer_nll(
    units: torch.Tensor,
    starts: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    hat: bool = False,
    monotonic: bool = False,
    fastemit: float = 0.0,
    *,
    values_checked: bool = False,
) -> torch.Tensor:
    """``-log`` of the summed probability of the paths inside the windows (the module
    docstring's exactness statement), from the joint's scores on the windows.

    The softmax is fused into the gather (:func:`~cbasr.losses.gather_logsumexp`);
    the gathered edge weights are scattered into ``(B, T, U + 1)`` lattice tables that hold
    ``-inf`` outside the windows, which :func:`~cbasr.losses.transducer.transducer_lattice_nll`
    sums over.

    Args:
        units: ``(B, T, S, V)`` unnormalised joint outputs at label positions
            ``starts[b, t] + s`` (positions past ``U`` are ignored).
        starts: ``(B, T)`` from :func:`prune_ranges`.
        targets: ``(B, U)`` units of the labels, in ``[1, V)``; padding ignored.
        input_lengths, target_lengths: ``(B,)``.
        hat: HAT's edges instead of RNN-T's.
        monotonic: the one-label-per-frame lattice.
        fastemit: FastEmit's ``lambda`` (Yu et al. 2021, arXiv:2010.11148): the label edges'
            gradient scaled by ``1 + lambda`` inside the windows, as on the whole lattice
            (:func:`~cbasr.losses.transducer.transducer_lattice_nll`); the value unchanged.
        values_checked: the lengths and label ids were checked already, by
            :func:`simple_transducer_nll` on the same ``targets``, lengths and vocabulary (a
            model's pruned loss): their values are not read again (the shapes still are).

    Returns:
        ``(B,)`` negative log-probabilities, differentiable once w.r.t. ``units``.
    """
    _check_fastemit(fastemit)
    check_floating("units", units)
    check_shape("units", units, "(B, T, S, V)", (None, None, None, None))
    B, T, S, V = units.shape
    check_shape("starts", starts, "(B, T)", (B, T))
    check_shape("targets", targets, "(B, U)", (B, None))
    U1 = targets.shape[1] + 1
    if not values_checked:
        with one_read():
            check_lengths("input_lengths", input_lengths, B, T, min_len=1)
            _check_labels(targets, target_lengths, V)
    device = units.device
    if _fused_joint(units, None, 1 if hat else 0):  # label y is unit y
        return fused_joint_nll(
            units,
            None,
            targets,
            input_lengths=input_lengths,
            target_lengths=target_lengths,
            starts=starts,
            hat=hat,
            start=1 if hat else 0,
            monotonic=monotonic,
            fastemit=fastemit,
        )
    positions = starts.to(device)[..., None] + torch.arange(S, device=device)  # (B, T, S)
    columns = label_columns(targets.to(device), target_lengths)  # (B, U + 1)
    label_units = columns.gather(1, positions.clamp(max=U1 - 1).flatten(1)).view(B, T, S)
    index = torch.stack([torch.zeros_like(label_units), label_units], dim=-1)
    picked, lse = gather_logsumexp(units.contiguous(), index, 1 if hat else 0)
    # padded frames hold whatever the joint made of padding: zeroed so nothing turns NaN
    pad_t = torch.arange(T, device=device)[None, :, None] >= input_lengths.to(device)[:, None, None]
    blank_units = torch.where(pad_t, 0.0, picked[..., 0])
    blank_lp, emit_lp = _edges(blank_units, torch.where(pad_t, 0.0, picked[..., 1]), lse, hat)
    # positions run to U + S - 1 at most: the tables get S - 1 spare columns, cut off after
    width = U1 + S - 1
    # in the edges' precision (float32 for half-precision units: the lattice sums in it)
    blank = blank_lp.new_full((B, T, width), _NEG_INF).scatter(2, positions, blank_lp)
    emit = emit_lp.new_full((B, T, width), _NEG_INF).scatter(2, positions, emit_lp)
    return _lattice_nll(
        blank[..., :U1], emit[..., : U1 - 1], input_lengths, target_lengths, monotonic, fastemit
    )
