"""Hybrid Autoregressive Transducer loss and internal language model score.

HAT paper (Variani et al. 2020, "Hybrid Autoregressive Transducer (HAT)", arXiv:2003.07705)
section 3. HAT keeps the RNN-T lattice (section 3.1; the
convention is documented in :mod:`cbasr.losses.transducer`) and splits each edge posterior,
eq. (4): a blank Bernoulli ``b_{t,u} = sigmoid(blank_logits[t, u])`` (eq. 5) for the
horizontal edge, and ``(1 - b_{t,u}) P_{t,u}(y_{u+1} | X, y_{0:u})`` for the vertical one,
where ``P_{t,u}`` is a softmax over the ``V`` labels without blank (eqs. 6-7).

Every function here takes ``monotonic``: the one-label-per-frame topology of
:mod:`cbasr.losses.transducer` (a label edge advances the frame too), with the same edge
weights.

``log(1 - b)`` is computed as ``logsigmoid(-blank_logit)``: exact, where ``log1p(-exp(log b))``
loses everything when ``b`` is close to 1.
"""

import torch
import torch.nn.functional as F

from cbasr.checks import check_floating, check_label_ids, check_lengths, check_shape, one_read
from cbasr.losses._joint import _fused_joint, fused_joint_nll, gather_logsumexp
from cbasr.losses.transducer import _check_fastemit, _lattice_nll

__all__ = ["hat_nll", "hat_nll_from_logits", "hat_internal_lm_score"]


def _gather_labels(
    log_probs: torch.Tensor, targets: torch.Tensor, target_lengths: torch.Tensor
) -> torch.Tensor:
    """``log_probs[..., u, targets[b, u]]`` for ``u < U``, zero at padded labels.

    Args:
        log_probs: ``(B, *, U + 1, V)``.
        targets: ``(B, U)``.
        target_lengths: ``(B,)``.

    Returns:
        ``(B, *, U)``.
    """
    B, U = targets.shape
    inner = [1] * (log_probs.dim() - 3)  # the frame dimension for the joint, none for the ILM
    positions = torch.arange(U, device=targets.device)[None, :]
    valid = positions < target_lengths.to(targets.device)[:, None]  # (B, U)
    ids = torch.where(valid, targets, 0).to(log_probs.device)  # (B, U); padding -> any valid id
    index = ids.view(B, *inner, U, 1).expand(*log_probs.shape[:-2], U, 1)  # (B, *, U, 1)
    # Gathering straight from the (U + 1)-row tensor (no slice) keeps the backward at one
    # joint-sized gradient.
    picked = torch.gather(log_probs, -1, index)[..., 0]  # (B, *, U)
    return torch.where(valid.to(log_probs.device).view(B, *inner, U), picked, 0.0)


def hat_nll(
    blank_logits: torch.Tensor,
    label_log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    monotonic: bool = False,
    fastemit: float = 0.0,
) -> torch.Tensor:
    """HAT ``-log P(y | X)``: the sum over RNN-T lattice paths of the product of eq. (4).

    Gathers the reference labels first (``B * T * U`` values), then runs the anti-diagonal
    lattice of :func:`~cbasr.losses.transducer.transducer_lattice_nll` with
    ``blank = logsigmoid(b)`` and ``label = logsigmoid(-b) + log P_{t,u}(y_{u+1})``.
    Extra memory is the lattice's ``O(B (T + U) U)`` plus, in backward, one gradient the size
    of ``label_log_probs``.

    Args:
        blank_logits: ``(B, T, U + 1)`` logits of the blank Bernoulli ``b_{t,u}`` (eq. 5).
        label_log_probs: ``(B, T, U + 1, V)`` log ``P_{t,u}(y | X, y_{0:u})`` over the ``V``
            labels (no blank), already log-softmaxed over ``V`` (eqs. 6-7).
        targets: ``(B, U)`` label ids in ``[0, V)``; padded entries are ignored.
        input_lengths: ``(B,)`` frames, ``1 <= T_b <= T``.
        target_lengths: ``(B,)`` labels, ``0 <= U_b <= U``.
        monotonic: the one-label-per-frame lattice (module docstring).
        fastemit: FastEmit's ``lambda``: the label edges' gradient scaled by ``1 + lambda``
            (:func:`~cbasr.losses.transducer.transducer_lattice_nll`).

    Returns:
        ``(B,)`` negative log likelihoods, differentiable once w.r.t. ``blank_logits`` and
        ``label_log_probs``.
    """
    _check_fastemit(fastemit)
    check_floating("blank_logits", blank_logits)
    check_floating("label_log_probs", label_log_probs)
    check_shape("blank_logits", blank_logits, "(B, T, U + 1)", (None, None, None))
    B, T, U1 = blank_logits.shape
    check_shape("label_log_probs", label_log_probs, "(B, T, U + 1, V)", (B, T, U1, None))
    check_shape("targets", targets, "(B, U)", (B, U1 - 1))
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T, min_len=1)
        check_lengths("target_lengths", target_lengths, B, U1 - 1)
        check_label_ids("targets", targets, target_lengths, label_log_probs.shape[-1])

    labels = _gather_labels(label_log_probs, targets, target_lengths)  # (B, T, U)
    return _hat_lattice(blank_logits, labels, input_lengths, target_lengths, monotonic, fastemit)


def _hat_lattice(
    blank_logits, labels, input_lengths, target_lengths, monotonic, fastemit
) -> torch.Tensor:
    """HAT eq. (4) on the lattice: ``blank_logits (B, T, U + 1)``, ``labels (B, T, U)`` the
    reference labels' ``log P_{t,u}(y_{u+1})``."""
    B, T, U1 = blank_logits.shape
    device = blank_logits.device
    # Padded frames and label positions are zeroed before logsigmoid so that whatever they
    # hold cannot turn into a NaN gradient.
    valid_t = torch.arange(T, device=device)[None, :] < input_lengths.to(device)[:, None]
    valid_u = torch.arange(U1, device=device)[None, :] <= target_lengths.to(device)[:, None]
    # in at least float32: a half-precision logit (autocast's) is not log-sigmoided in it
    blank_logits = blank_logits.to(torch.promote_types(blank_logits.dtype, torch.float32))
    b = torch.where(valid_t[:, :, None] & valid_u[:, None, :], blank_logits, 0.0)  # (B, T, U1)
    # HAT eq. (4): blank edge b_{t,u}; label edge (1 - b_{t,u}) P_{t,u}(y_{u+1}).
    blank_lp = F.logsigmoid(b)  # (B, T, U + 1)
    emit_lp = F.logsigmoid(-b[:, :, :-1]) + labels  # (B, T, U)
    return _lattice_nll(blank_lp, emit_lp, input_lengths, target_lengths, monotonic, fastemit)


def hat_nll_from_logits(
    blank_logits: torch.Tensor | None,
    label_logits: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    monotonic: bool = False,
    fastemit: float = 0.0,
) -> torch.Tensor:
    """:func:`hat_nll` from unnormalised label scores, with the label softmax (eqs. 6-7) fused
    into the gather (:func:`~cbasr.losses.gather_logsumexp`): no normalised
    ``(B, T, U + 1, V)`` tensor exists, and the backward's extra memory is one gradient the
    size of ``label_logits``.

    Args:
        blank_logits: ``(B, T, U + 1)``, or None when the blank logit is unit 0 of
            ``label_logits`` (the joint's blank output beside the labels, read from the same
            tensor so that its gradient lands in the same single gradient).
        label_logits: ``(B, T, U + 1, V)`` label scores (``V + 1`` units with the blank unit
            first when ``blank_logits`` is None); contiguous.
        targets, input_lengths, target_lengths, monotonic, fastemit: as :func:`hat_nll`.
    """
    _check_fastemit(fastemit)
    check_floating("label_logits", label_logits)
    check_shape("label_logits", label_logits, "(B, T, U + 1, V)", (None, None, None, None))
    B, T, U1, V = label_logits.shape
    start = 1 if blank_logits is None else 0  # the labels' first unit
    if blank_logits is not None:
        check_floating("blank_logits", blank_logits)
        check_shape("blank_logits", blank_logits, "(B, T, U + 1)", (B, T, U1))
    check_shape("targets", targets, "(B, U)", (B, U1 - 1))
    with one_read():
        check_lengths("input_lengths", input_lengths, B, T, min_len=1)
        check_lengths("target_lengths", target_lengths, B, U1 - 1)
        check_label_ids("targets", targets, target_lengths, V - start)
    device = label_logits.device
    if _fused_joint(label_logits, blank_logits, start):  # label y is column start + y
        return fused_joint_nll(
            label_logits,
            blank_logits,
            targets,
            input_lengths=input_lengths,
            target_lengths=target_lengths,
            hat=True,
            start=start,
            offset=start,
            monotonic=monotonic,
            fastemit=fastemit,
        )
    valid = torch.arange(U1 - 1, device=device)[None, :] < target_lengths.to(device)[:, None]
    ids = F.pad(torch.where(valid, targets.to(device), 0), (0, 1)) + start  # (B, U + 1)
    columns = [torch.zeros_like(ids), ids] if blank_logits is None else [ids]
    index = torch.stack(columns, dim=-1)[:, None].expand(B, T, U1, len(columns))
    picked, lse = gather_logsumexp(label_logits.contiguous(), index, start)
    labels = (picked[..., -1] - lse)[:, :, :-1]  # (B, T, U): log P_{t,u}(y_{u+1})
    labels = torch.where(valid[:, None, :], labels, 0.0)
    blank = picked[..., 0] if blank_logits is None else blank_logits
    return _hat_lattice(blank, labels, input_lengths, target_lengths, monotonic, fastemit)


def hat_internal_lm_score(
    ilm_log_probs: torch.Tensor, targets: torch.Tensor, target_lengths: torch.Tensor
) -> torch.Tensor:
    """Sequence-level internal LM score, HAT eq. (8): ``log P_ILM(y) = sum_{u < U_b}
    log P(y_{u+1} | y_{0:u})``.

    The label distribution comes from the prediction network alone, ``softmax(J(g_u))``
    (section 3.2); HAT's decoder (eq. 9) subtracts ``lambda_2`` times this score. There is no
    end-of-sequence term.

    Args:
        ilm_log_probs: ``(B, U + 1, V)`` log-softmaxed ``J(g_u)`` for ``u = 0 .. U``; row ``U``
            (after the last label) is not used.
        targets: ``(B, U)`` label ids in ``[0, V)``; padded entries are ignored.
        target_lengths: ``(B,)`` labels, ``0 <= U_b <= U``.

    Returns:
        ``(B,)`` log probabilities (a score, not a loss: higher is more likely), differentiable
        w.r.t. ``ilm_log_probs``.
    """
    check_floating("ilm_log_probs", ilm_log_probs)
    check_shape("targets", targets, "(B, U)", (None, None))
    B, U = targets.shape
    check_shape("ilm_log_probs", ilm_log_probs, "(B, U + 1, V)", (B, U + 1, None))
    with one_read():
        check_lengths("target_lengths", target_lengths, B, U)
        check_label_ids("targets", targets, target_lengths, ilm_log_probs.shape[-1])
    return _gather_labels(ilm_log_probs, targets, target_lengths).sum(dim=-1)
