"""Time-synchronous prefix beam search for Conditional Bernoulli models.

CB paper section 2.4 and footnote 5. With independent emission Bernoullis, ``P(y) = sum_b
prod_t P(b_t) prod_l P(y_l | t_l, ...)`` (eq. 38) is a sum over frame-by-frame paths: at frame
``t`` a prefix either does not emit (``log P(B_t = 0)``) or emits one label ``v``
(``log P(B_t = 1) + log P(v | t, prefix)``): ``V + 1`` extensions per kept prefix and frame
(``V - 1`` labels here, plus staying; footnote 5 counts the blank). The search keeps, per
utterance, the ``beam`` best rows and sums the candidates that reach the same state:

- ``order == "memoryless"`` (pointwise, attention-emission, fixed-window monotonic): the label
  terms depend on the current emission time and the labels only, so every path with the same
  prefix continues identically. A row is a label prefix and its score ``alpha_t(y)`` the log
  of the total probability of the patterns of frames ``< t`` that emit exactly ``y``; the
  forward recursion of eq. (38) run for every prefix at once. Without pruning
  (``beam=None``) the final scores are exactly ``log P(y)`` for every ``y`` with at most
  ``T`` labels and the best one is the exact ``argmax_y P(y)`` (tested against an
  enumeration with :func:`~cbasr.losses.cb_marginal_nll`).
- ``order == "second_order"`` (variable-window monotonic): the label terms also read the
  previous emission time, so a row is a prefix *and* its last emission frame; emissions that
  reach the same (prefix, frame) are summed, and the final score of ``y`` sums its rows:
  exact too without pruning (tested with :func:`~cbasr.losses.cb_marginal_nll_windowed`).
- ``order == "history"`` (autoregressive decoders, label terms reading every earlier emission
  time): rows are merged by prefix as for memoryless decoders, keeping the decoder state of
  the more probable path: an approximation, no exactness claim (the label-synchronous search
  of :mod:`cbasr.search.label_synchronous`, ``cb_search="label"``, is exact without pruning).

With ``beam=1``, no LM and no label bonus, each frame keeps the better of "stay" and "emit the
best label": the model's greedy search (:meth:`~cbasr.models.CBModel.greedy_decode`), tested
for every decoder.
"""

import torch
import torch.nn.functional as F

from cbasr.modules.decoders import CBDecoder, LabelOrder
from cbasr.search.fusion import LabelScorer
from cbasr.search.hypotheses import BeamSearchOptions, Hypothesis
from cbasr.search.prefix import (
    PrefixScores,
    extension_pairs,
    finalize,
    fused_extensions,
    next_prefixes,
    next_scores,
    prefix_groups,
    select,
)
from cbasr.search.rows import DecoderRows, utterance_rows

__all__ = ["cb_beam_search"]

_NEG_INF = float("-inf")


def _merge_extensions_into_stays(
    stay: torch.Tensor, emit: torch.Tensor, prefixes: list, batch: int, width: int
) -> None:
    """Sum each row's "stay" candidate with the candidate extending its parent to the same
    prefix (in place). The sum goes to the more probable of the two, whose decoder state the
    merged hypothesis keeps; the other becomes ``-inf``.

    Args:
        stay: ``(N,)``; emit: ``(N, V - 1)``.
    """
    rows, parents, labels = extension_pairs(prefixes, batch, width)
    if not rows:
        return
    rows = torch.tensor(rows, device=stay.device)
    parents = torch.tensor(parents, device=stay.device)
    cols = torch.tensor(labels, device=stay.device) - 1  # label id v is column v - 1
    s, e = stay[rows], emit[parents, cols]
    merged = torch.logaddexp(s, e)
    via_emission = e > s
    stay[rows] = torch.where(via_emission, _NEG_INF, merged)
    emit[parents, cols] = torch.where(via_emission, merged, _NEG_INF)


def _merge_equal_emissions(emit: torch.Tensor, prefixes: list, batch: int, width: int) -> None:
    """Second order: rows with the same prefix (and different last emission frames) that emit
    the same label now reach the same state (prefix + label, this frame): sum them into the
    most probable one (in place)."""
    for rows in prefix_groups(prefixes, batch, width):
        rows = torch.tensor(rows, device=emit.device)
        group = emit[rows]  # (G, V - 1)
        merged = torch.logsumexp(group, dim=0)  # (V - 1,)
        best = group.argmax(dim=0)  # (V - 1,)
        out = torch.full_like(group, _NEG_INF)
        out[best, torch.arange(group.shape[1], device=emit.device)] = merged
        emit[rows] = out


@torch.no_grad()
def cb_beam_search(
    decoder: CBDecoder,
    h: torch.Tensor,
    lens: torch.Tensor,
    options: BeamSearchOptions,
    lm: LabelScorer | None = None,
    per_utterance: tuple[str, ...] | None = None,
) -> list[list[Hypothesis]]:
    """Prefix beam search over a CB decoder's frame-synchronous scores (module docstring).

    Args:
        decoder: a :class:`~cbasr.modules.decoders.CBDecoder`.
        h: ``(B, T, D)`` encoder states; lens: ``(B,)`` valid frames.
        options: beam, n-best, weights (``ilm_weight`` must be 0: CB models have no internal LM
            of HAT's kind).
        lm: external LM for shallow fusion (``options.lm_weight``).
        per_utterance: see :class:`~cbasr.search.rows.DecoderRows` (tests only).

    Returns:
        Per utterance, its hypotheses best first (``options.nbest`` of them).
    """
    if not isinstance(decoder, CBDecoder):
        raise TypeError(f"cb_beam_search needs a CB decoder, got {type(decoder).__name__}")
    if options.ilm_weight != 0:
        raise ValueError("ilm_weight (HAT eq. 9's lambda_2) applies to HAT models only")
    B, T = h.shape[0], h.shape[1]
    if B == 0:
        return []
    device = h.device
    second_order = decoder.order is LabelOrder.SECOND_ORDER
    rows = DecoderRows(decoder, decoder.begin(h, lens), B, 1, per_utterance, device)
    width = 1
    scores = PrefixScores(B, torch.promote_types(h.dtype, torch.float32), device)
    scores.am.zero_()
    prefixes: list = [()] * B
    lm_state = lm.begin(B, device) if lm is not None else None
    lens = lens.to(device)
    for t in range(T):
        state = rows.state
        emit_logit, label_lp = decoder.candidates(state, t)  # (N,), (N, V - 1)
        rows.update(state)
        V1 = label_lp.shape[1]
        active = (t < lens)[utterance_rows(B, width, device)]  # (N,)
        a = emit_logit.to(scores.am.dtype)
        # CB eq. (38), one frame: stay with P(B_t = 0), or emit with P(B_t = 1) P(v | t, ...).
        stay = scores.am + torch.where(active, F.logsigmoid(-a), 0.0)  # (N,)
        emit = scores.am[:, None] + F.logsigmoid(a)[:, None] + label_lp.to(a.dtype)  # (N, V - 1)
        emit = emit.masked_fill(~active[:, None], _NEG_INF)
        if second_order:
            _merge_equal_emissions(emit, prefixes, B, width)
        else:
            _merge_extensions_into_stays(stay, emit, prefixes, B, width)
        lm_lp = lm_state["log_probs"].to(a.dtype) if lm is not None else None
        extend = fused_extensions(scores.fused, options, V1, lm_lp)  # (N, V - 1)
        # (N, V): column 0 stays
        total = torch.cat(
            [(options.am_weight * stay + scores.fused)[:, None], options.am_weight * emit + extend],
            dim=1,
        )
        values, index, new_width = select(total.view(B, width * (V1 + 1)), options.beam)
        batch_base = (torch.arange(B, device=device) * width)[:, None]  # (B, 1)
        parent = (batch_base + index // (V1 + 1)).flatten()  # (B W,) global rows
        col = (index % (V1 + 1)).flatten()
        alive = torch.isfinite(values).flatten()
        emitted = (col > 0) & alive
        labels = torch.where(emitted, col, 1)
        am = torch.where(
            emitted, emit[parent].gather(1, (labels - 1)[:, None]).squeeze(1), stay[parent]
        )
        new = next_scores(
            scores, parent, emitted, labels, am.masked_fill(~alive, _NEG_INF), extend, lm_lp
        )
        prefixes = next_prefixes(prefixes, parent, col, alive)
        rows.reorder(parent, new_width)
        rows.update(decoder.commit(rows.state, t, emitted, labels))
        if lm is not None:
            lm_state = lm.advance(lm.reorder(lm_state, parent), emitted, labels)
        scores, width = new, new_width
    eos = lm_state["eos"].to(scores.am.dtype) if lm is not None else None
    return finalize(
        prefixes, scores.am, scores.fused, scores.lm, scores.ilm, eos, B, width, options
    )
