"""The pruned transducer loss's trivial joint (step 1 of :mod:`cbasr.losses.pruned`; Kuang et
al. 2022, "Pruned RNN-T for fast, memory-efficient ASR training", arXiv:2206.13236): the
joint ``am_t + lm_u`` linear in the encoder and prediction outputs, whose normaliser over the
units factors into one matrix product, and the RNN-T or HAT (HAT paper eq. 4) edge weights
it gives over the whole lattice."""

import torch
import torch.nn.functional as F

from cbasr.checks import check_floating, check_label_ids, check_lengths, check_shape, one_read

__all__ = ["trivial_joint_log_probs", "label_columns"]


def label_columns(targets: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """``(B, U + 1)``: the unit of label ``y_{u+1}`` at each position ``u`` (0 where there is
    none: padding and ``u = U_b``), for gathering."""
    U = targets.shape[1]
    valid = (
        torch.arange(U, device=targets.device)[None, :] < target_lengths.to(targets.device)[:, None]
    )
    return F.pad(torch.where(valid, targets, 0), (0, 1))


def _edges(
    blank_units: torch.Tensor, label_units: torch.Tensor, lse: torch.Tensor, hat: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Edge log-weights from unit 0's score, the next label's score and the normaliser:
    RNN-T ``(blank - lse, label - lse)``; HAT eq. (4) ``(log b, log(1 - b) + label - lse)``."""
    if hat:
        return F.logsigmoid(blank_units), F.logsigmoid(-blank_units) + label_units - lse
    return blank_units - lse, label_units - lse


def trivial_joint_log_probs(
    am: torch.Tensor,
    lm: torch.Tensor,
    targets: torch.Tensor,
    target_lengths: torch.Tensor,
    hat: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Edge log-weights of the trivial joint ``am_t + lm_u`` over the whole lattice.

    Its normaliser over the units ``c`` (all of them for RNN-T, ``1 ..`` for HAT) factors:
    ``log sum_c exp(am_t[c] + lm_u[c]) = m_t + n_u + log sum_c exp(am_t[c] - m_t)
    exp(lm_u[c] - n_u)``, with ``m_t``, ``n_u`` the row maxima: one ``(T, V) x (V, U + 1)``
    product per utterance, computed in float64 (a float32 product underflows when the two
    rows' large entries fall on different units). No ``(B, T, U + 1, V)`` tensor exists.

    Args:
        am: ``(B, T, V)`` encoder side; lm: ``(B, U + 1, V)`` prediction side.
        targets: ``(B, U)`` units of the labels, in ``[1, V)``; padding ignored.
        target_lengths: ``(B,)``.
        hat: HAT's edges (module docstring) instead of RNN-T's.

    Returns:
        ``blank (B, T, U + 1)`` and ``emit (B, T, U)`` log-weights in ``am``'s dtype, the
        arguments of :func:`~cbasr.losses.transducer.transducer_lattice_nll`;
        differentiable w.r.t. ``am`` and ``lm``.
    """
    _check_joint_sides(am, lm, targets)
    with one_read():
        _check_labels(targets, target_lengths, am.shape[2])
    return _trivial_joint(am, lm, targets, target_lengths, hat)


def _check_joint_sides(am, lm, targets) -> None:
    """The shape checks of :func:`trivial_joint_log_probs`."""
    check_floating("am", am)
    check_floating("lm", lm)
    check_shape("am", am, "(B, T, V)", (None, None, None))
    B, T, V = am.shape
    check_shape("lm", lm, "(B, U + 1, V)", (B, None, V))
    check_shape("targets", targets, "(B, U)", (B, lm.shape[1] - 1))


def _check_labels(targets, target_lengths, V) -> None:
    """The value checks of the label side: lengths, and unit ids in ``[1, V)``."""
    check_lengths("target_lengths", target_lengths, targets.shape[0], targets.shape[1])
    check_label_ids("targets", targets, target_lengths, V, blank=0)


def _trivial_joint(am, lm, targets, target_lengths, hat):
    """:func:`trivial_joint_log_probs` on arguments already checked."""
    B, T, V = am.shape
    U1 = lm.shape[1]
    a, b = am.double(), lm.double()
    start = 1 if hat else 0
    a_max = a[..., start:].amax(dim=-1, keepdim=True).detach()  # (B, T, 1)
    b_max = b[..., start:].amax(dim=-1, keepdim=True).detach()  # (B, U + 1, 1)
    products = torch.bmm(
        (a[..., start:] - a_max).exp(), (b[..., start:] - b_max).exp().transpose(1, 2)
    )
    lse = products.clamp(min=torch.finfo(torch.float64).tiny).log() + a_max + b_max.transpose(1, 2)
    columns = label_columns(targets, target_lengths).to(am.device)  # (B, U + 1)
    label_am = a.gather(-1, columns[:, None, :].expand(B, T, U1))  # (B, T, U + 1)
    label_lm = b.gather(-1, columns[..., None]).transpose(1, 2)  # (B, 1, U + 1)
    label = label_am + label_lm
    blank = a[..., :1] + b[..., 0][:, None, :]  # (B, T, U + 1)
    blank_lp, emit_lp = _edges(blank, label, lse, hat)
    return blank_lp.to(am.dtype), emit_lp[..., :-1].to(am.dtype)
