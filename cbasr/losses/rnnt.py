"""The RNN-T loss from a joint's logits (Graves, 2012, "Sequence Transduction with Recurrent
Neural Networks", arXiv:1211.3711): :func:`rnnt_nll`, torchaudio's fused kernel, and
:func:`rnnt_lattice_nll`, the log-softmax's two needed entries per node gathered first and
summed over the lattice of :mod:`cbasr.losses.transducer` (either topology, float64 too)."""

import torch
import torch.nn.functional as F
import torchaudio.functional as AF

from cbasr.checks import check_floating, check_label_ids, check_lengths, check_shape, one_read
from cbasr.losses._joint import _fused_joint, fused_joint_nll, gather_logsumexp
from cbasr.losses.transducer import _check_fastemit, _lattice_nll

__all__ = ["rnnt_nll", "rnnt_lattice_nll"]


def _check_rnnt_inputs(logits, targets, input_lengths, target_lengths, blank: int) -> None:
    """The argument checks both RNN-T losses make, each error naming the argument."""
    check_floating("logits", logits)
    check_shape("logits", logits, "(B, T, U + 1, V)", (None, None, None, None))
    B, T, U1, V = logits.shape
    check_shape("targets", targets, "(B, U)", (B, U1 - 1))
    if not 0 <= blank < V:
        raise ValueError(f"blank = {blank} must be in [0, {V})")
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T, min_len=1)
        check_lengths("target_lengths", target_lengths, B, U1 - 1)
        check_label_ids("targets", targets, target_lengths, V, blank=blank)


def rnnt_lattice_nll(
    logits: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
    monotonic: bool = False,
    fastemit: float = 0.0,
) -> torch.Tensor:
    """RNN-T ``-log P(y | x)`` per utterance from the joint's logits, without torchaudio: the
    blank's and the next label's log-softmax at every node (:func:`gather_logsumexp`, no
    normalised joint tensor), then :func:`transducer_lattice_nll`. Same value as
    :func:`rnnt_nll`; float64 too; far faster on CPU, and its extra memory is one joint-sized
    gradient.

    Args:
        logits, targets, input_lengths, target_lengths, blank: as :func:`rnnt_nll`.
        monotonic: the one-label-per-frame topology (module docstring), which torchaudio's
            loss does not have.
        fastemit: FastEmit's ``lambda`` (:func:`transducer_lattice_nll`), which torchaudio's
            loss does not have either.
    """
    _check_rnnt_inputs(logits, targets, input_lengths, target_lengths, blank)
    _check_fastemit(fastemit)
    B, T, U1, V = logits.shape
    device = logits.device
    if blank == 0 and _fused_joint(logits, None, 0):
        return fused_joint_nll(
            logits,
            None,
            targets,
            input_lengths=input_lengths,
            target_lengths=target_lengths,
            monotonic=monotonic,
            fastemit=fastemit,
        )
    valid = torch.arange(U1 - 1, device=device)[None, :] < target_lengths.to(device)[:, None]
    labels = torch.where(valid, targets.to(device), blank)  # (B, U): padding -> any valid id
    labels = F.pad(labels, (0, 1), value=blank)  # (B, U + 1): nothing is emitted from u = U
    index = torch.stack([torch.full_like(labels, blank), labels], dim=-1)  # (B, U + 1, 2)
    index = index[:, None].expand(B, T, U1, 2)
    picked, lse = gather_logsumexp(logits, index)
    log_probs = picked - lse.unsqueeze(-1)  # (B, T, U + 1, 2)
    emit = log_probs[:, :, :-1, 1]
    return _lattice_nll(log_probs[..., 0], emit, input_lengths, target_lengths, monotonic, fastemit)


def rnnt_nll(
    logits: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
) -> torch.Tensor:
    """RNN-T ``-log P(y | x)`` per utterance: a thin wrapper over
    :func:`torchaudio.functional.rnnt_loss` (``reduction="none"``, fused log-softmax).

    torchaudio needs the logits' time and label dimensions to equal the batch's longest
    ``T_b`` and ``U_b + 1``; longer padding is sliced off here (which copies the joint).

    Args:
        logits: ``(B, T, U + 1, V)`` unnormalised joint scores over ``V`` classes including
            ``blank``; float32 or float16 (torchaudio has no float64 kernel).
        targets: ``(B, U)`` label ids in ``[0, V)``, never ``blank``; padded entries ignored.
        input_lengths: ``(B,)`` frames, ``1 <= T_b <= T``.
        target_lengths: ``(B,)`` labels, ``0 <= U_b <= U``.
        blank: id of the blank class.

    Returns:
        ``(B,)`` negative log likelihoods, differentiable w.r.t. ``logits``.
    """
    check_floating("logits", logits)
    check_shape("logits", logits, "(B, T, U + 1, V)", (None, None, None, None))
    B, T, U1, V = logits.shape
    if logits.dtype not in (torch.float32, torch.float16):
        raise ValueError(
            f"logits must be float32 or float16 for torchaudio's rnnt_loss; got {logits.dtype} "
            "(transducer_lattice_nll accepts float64)"
        )
    _check_rnnt_inputs(logits, targets, input_lengths, target_lengths, blank)
    if B == 0:
        return logits.flatten(1).sum(1)  # (0,), in the graph
    max_t, max_u = torch.stack(  # one read of the device
        [input_lengths.max(), target_lengths.to(input_lengths.device).max()]
    ).tolist()
    if (max_t, max_u + 1) != (T, U1):
        logits = logits[:, :max_t, : max_u + 1]
    return AF.rnnt_loss(
        logits.contiguous(),
        targets[:, :max_u].to(device=logits.device, dtype=torch.int32).contiguous(),
        input_lengths.to(device=logits.device, dtype=torch.int32),
        target_lengths.to(device=logits.device, dtype=torch.int32),
        blank=blank,
        reduction="none",
    )
