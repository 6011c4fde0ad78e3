"""Connectionist Temporal Classification loss (Graves et al., 2006), per utterance."""

import torch
import torch.nn.functional as F

from cbasr import _backends
from cbasr.checks import (
    check_floating,
    check_label_ids,
    check_lengths,
    check_shape,
    in_graph_step,
    one_read,
)

__all__ = ["ctc_nll"]


def ctc_nll(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
    *,
    values_checked: bool = False,
) -> torch.Tensor:
    """-log P(y | x) under CTC, one value per utterance.

    ``P(y | x)`` sums, over every alignment ``pi`` in ``V^T_b`` whose collapse (merge
    repeated symbols, then drop blanks) is ``y``, the product ``prod_t P(pi_t | x)``. A thin
    wrapper over :func:`torch.nn.functional.ctc_loss` with cbasr's conventions: batch-first
    inputs and no reduction. (The CB loss is the variant that does not merge repeats and
    parameterises the blank separately; see :mod:`cbasr.losses.conditional_bernoulli`.)

    Args:
        log_probs: ``(B, T, V)`` log-softmax outputs over the blank-augmented vocabulary.
        targets: ``(B, L)`` label ids in ``[0, V)``, padded (padding is ignored); never
            ``blank``.
        input_lengths: ``(B,)`` valid frames per utterance, ``T_b <= T``.
        target_lengths: ``(B,)`` valid labels per utterance, ``L_b <= L``.
        blank: id of the blank symbol.
        values_checked: the lengths and label ids were checked already against the same
            ``T``, vocabulary and blank (a transducer's loss on the same targets, of which this
            is the auxiliary loss): their values are not read again (the shapes still are).

    Returns:
        ``(B,)`` negative log likelihoods; ``inf`` where no alignment exists
        (more labels, counting one extra frame per adjacent repeat, than frames).
        Differentiable w.r.t. ``log_probs``, with PyTorch's fused-kernel caveat: the gradient
        it returns is the gradient w.r.t. the logits *before* ``log_softmax`` (``softmax -
        posterior``), which becomes correct once back-propagated through a
        ``log_softmax`` over ``V``. Always feed it ``log_softmax`` outputs that are part of
        the graph; do not gradcheck it w.r.t. ``log_probs`` directly.

    In the step of a CUDA graph (:func:`cbasr.checks.in_graph_step`, ``trainer.cuda_graphs``)
    on the ``triton`` backend, two Triton kernels (:mod:`cbasr.losses._ctc_triton`) compute it
    instead, without reading the lengths on the host; their gradient is the true one w.r.t.
    ``log_probs`` (the same through a ``log_softmax``).
    """
    check_floating("log_probs", log_probs)
    check_shape("log_probs", log_probs, "(B, T, V)", (None, None, None))
    B, T, V = log_probs.shape
    check_shape("targets", targets, "(B, L)", (B, None))
    if not 0 <= blank < V:
        raise ValueError(f"blank = {blank} must be in [0, {V})")
    if not values_checked:
        with one_read():
            check_lengths("input_lengths", input_lengths, B, T)
            check_lengths("target_lengths", target_lengths, B, targets.shape[1])
            check_label_ids("targets", targets, target_lengths, V, blank=blank)
    if in_graph_step() and _backends.backend(log_probs) == "triton":
        # the step of a CUDA graph: torch's CUDA ctc_loss reads the lengths on the host
        from cbasr.losses import _ctc_triton

        half = log_probs.dtype in (torch.float16, torch.bfloat16)  # (the kernels: fp32, fp64)
        lp = log_probs.float() if half else log_probs
        return _ctc_triton.ctc_nll(lp, targets, input_lengths, target_lengths, blank)
    # The native kernels take int64 lengths (int32 on CUDA would select cuDNN, with its
    # own restrictions).
    return F.ctc_loss(
        log_probs.transpose(0, 1),  # (B, T, V) -> (T, B, V)
        targets,
        input_lengths.long(),
        target_lengths.long(),
        blank=blank,
        reduction="none",
        zero_infinity=False,
    )
