"""The token-and-duration transducer (TDT) loss: Xu, Jia, Huang, Tsai, Ginsburg and Harrah 2023,
"Efficient Sequence Transduction by Jointly Predicting Tokens and Durations", ICML 2023,
arXiv:2304.06795.

The joint gives, at every lattice node ``(t, u)`` (frame ``t``, ``u`` labels emitted), a
distribution over tokens ``P_T(v | t, u)`` (blank and labels) and, normalised apart, one over
durations ``P_D(d | t, u)`` for ``d`` in a fixed set ``D`` such as ``{0, 1, 2, 3, 4}``; an edge
takes a token and a duration together, with probability ``P_T(v) P_D(d)`` (eq. 5). A blank
edge moves from ``(t, u)`` to ``(t + d, u)`` with ``d >= 1`` (a blank of duration 0 is not
an edge: footnote 4); a label edge emitting ``y_{u+1}`` moves to ``(t + d, u + 1)`` with any
``d`` in ``D``, 0 included, so several labels may come from one frame. The forward variable
(eq. 6, with frames counted from 0 here) is

    alpha(t, u) = sum_{d in D, d > 0} alpha(t - d, u) P_T(blank | t - d, u) P_D(d | t - d, u)
                + sum_{d in D} alpha(t - d, u - 1) P_T(y_u | t - d, u - 1) P_D(d | t - d, u - 1)

from ``alpha(0, 0) = 1``, and ``P(y | x)`` (eq. 7) is the probability of arriving at frame
``T`` with all ``U`` labels emitted. As NeMo's TDT loss computes it, a path ends with a blank
that lands exactly on ``T`` and a label edge never leaves the frames (``t + d <= T - 1``):

    P(y | x) = sum_{d in D, d > 0} alpha(T - d, U) P_T(blank | T - d, U) P_D(d | T - d, U).

``sigma`` is the paper's logit under-normalisation (eqs. 15-16): ``log P_T - sigma`` for
every token in training, which favours paths of fewer edges, hence longer durations.

The recursion here runs over frames with autograd: each frame gathers the edges arriving from
the ``|D|`` frames before it (vectorised over labels) and then the chain of duration-0 label
edges within the frame, a prefix log-sum-exp over ``u``. Unreachable nodes hold a large
negative number, not ``-inf``, so that no gradient is ``nan``.
"""

import torch

from cbasr.checks import check_floating, check_label_ids, check_lengths, check_shape, one_read
from cbasr.config.schema import check_durations

__all__ = ["check_durations", "tdt_nll"]

_UNREACHABLE = -1.0e30


def tdt_nll(
    token_log_probs: torch.Tensor,
    duration_log_probs: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    durations,
    sigma: float = 0.0,
) -> torch.Tensor:
    """``-log P(y | x)`` per utterance over the TDT lattice (module docstring), ``(B,)``.

    Args:
        token_log_probs: ``(B, T, U + 1, V)`` ``log P_T(v | t, u)``, blank at 0.
        duration_log_probs: ``(B, T, U + 1, |D|)`` ``log P_D(d | t, u)``, in the order of
            ``durations``.
        targets: ``(B, U)`` label ids in ``1 .. V - 1`` (padding past each length is ignored).
        logit_lengths, target_lengths: ``(B,)`` frames ``T_b`` and labels ``U_b``.
        durations: the duration set ``D`` (:func:`cbasr.config.schema.check_durations`).
        sigma: subtracted from every token log-probability (eqs. 15-16); 0 in evaluation.
    """
    durations = check_durations(durations, "durations")
    check_floating("token_log_probs", token_log_probs)
    check_shape("token_log_probs", token_log_probs, "(B, T, U + 1, V)", (None,) * 4)
    B, T, U1, V = token_log_probs.shape
    shape = (B, T, U1, len(durations))
    check_shape("duration_log_probs", duration_log_probs, "(B, T, U + 1, |D|)", shape)
    check_shape("targets", targets, "(B, U)", (B, U1 - 1))
    with one_read():
        check_lengths("logit_lengths", logit_lengths, B, T, min_len=1)
        check_lengths("target_lengths", target_lengths, B, U1 - 1)
        check_label_ids("targets", targets, target_lengths, V, blank=0)
    device, dtype = token_log_probs.device, token_log_probs.dtype
    tokens = token_log_probs - sigma
    blank = tokens[..., 0]  # (B, T, U + 1)
    index = targets.long().clamp(min=0, max=V - 1)[:, None, :, None].expand(-1, T, -1, 1)
    emit = tokens[:, :, :-1].gather(3, index).squeeze(3)  # (B, T, U): emit y_{u+1} at (t, u)
    # edge weights per duration: (T, B, U + 1) and (T, B, U) for each d
    blank_by_d = {
        d: (blank + duration_log_probs[..., k]).transpose(0, 1)
        for k, d in enumerate(durations)
        if d > 0
    }
    emit_by_d = {
        d: (emit + duration_log_probs[:, :, :-1, k]).transpose(0, 1)
        for k, d in enumerate(durations)
    }
    start = torch.full((B, U1), _UNREACHABLE, device=device, dtype=dtype)
    start[:, 0] = 0.0
    alpha: list[torch.Tensor] = []  # alpha[t]: (B, U + 1)
    for t in range(T):
        arriving = [start] if t == 0 else []
        for d, weight in blank_by_d.items():
            if t - d >= 0:
                arriving.append(alpha[t - d] + weight[t - d])
        for d, weight in emit_by_d.items():
            if d > 0 and t - d >= 0:
                moved = alpha[t - d][:, :-1] + weight[t - d]  # (B, U): arrives at u + 1
                arriving.append(torch.cat([start.new_full((B, 1), _UNREACHABLE), moved], 1))
        before = torch.stack(arriving).logsumexp(0) if len(arriving) > 1 else arriving[0]
        if 0 in emit_by_d and U1 > 1:  # labels of duration 0: a chain along u within frame t
            # alpha[u] = logsumexp_{k <= u} before[k] + sum_{k < j <= u} w[j - 1]
            steps = torch.cumsum(emit_by_d[0][t], dim=1)  # (B, U)
            prefix = torch.cat([steps.new_zeros(B, 1), steps], 1)  # (B, U + 1)
            before = prefix + torch.logcumsumexp(before - prefix, dim=1)
        alpha.append(before)
    table = torch.stack(alpha)  # (T, B, U + 1)
    rows = torch.arange(B, device=device)
    ends = []
    for k, d in enumerate(durations):
        if d == 0:
            continue
        t = logit_lengths.to(device).long() - d  # (B,)
        ok = t >= 0
        tc = t.clamp(min=0)
        u = target_lengths.to(device).long()
        score = table[tc, rows, u] + blank[rows, tc, u] + duration_log_probs[rows, tc, u, k]
        ends.append(torch.where(ok, score, torch.full_like(score, _UNREACHABLE)))
    log_p = torch.stack(ends).logsumexp(0)
    return -log_p
