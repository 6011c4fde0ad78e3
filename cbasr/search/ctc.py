"""CTC prefix beam search (Graves, 2008, section 7.5; Hannun et al., 2014).

Each kept prefix ``y`` carries two forward variables: ``p_b`` for the alignments of frames
``< t`` that collapse to ``y`` and end in a blank, ``p_nb`` for those ending in ``y``'s last
label. At frame ``t``, with ``c`` the last label of ``y``:

    p_b(y)    <- (p_b(y) + p_nb(y)) P_t(blank)                 (stay, ending in a blank)
    p_nb(y)   <- p_nb(y) P_t(c)                                (stay, repeating c: merged)
    p_nb(y v) <- (p_b(y) + p_nb(y)) P_t(v)   for v != c        (extend)
    p_nb(y c) <- p_b(y) P_t(c)                                 (extend by a repeat: needs a blank)

and an extension that equals another kept prefix is added to that prefix's ``p_nb``. Without
pruning (``beam=None``) every prefix's ``p_b + p_nb`` after the last frame is exactly its CTC
probability ``P(y | x)``, so the best hypothesis is the exact ``argmax_y P(y | x)`` (tested by
enumeration with :func:`~cbasr.losses.ctc_nll`).

Beam 1 is *not* the best-path (greedy) decoding of :meth:`~cbasr.models.CTCModel.greedy_decode`:
that follows the most probable single alignment, this the most probable prefix's summed
alignments.
"""

import torch

from cbasr.search.fusion import LabelScorer
from cbasr.search.hypotheses import BeamSearchOptions, Hypothesis
from cbasr.search.prefix import (
    PrefixScores,
    extension_pairs,
    finalize,
    fused_extensions,
    next_prefixes,
    next_scores,
    select,
)
from cbasr.search.rows import utterance_rows

__all__ = ["ctc_prefix_beam_search"]

_NEG_INF = float("-inf")


@torch.no_grad()
def ctc_prefix_beam_search(
    log_probs: torch.Tensor,
    lens: torch.Tensor,
    options: BeamSearchOptions,
    lm: LabelScorer | None = None,
    blank: int = 0,
) -> list[list[Hypothesis]]:
    """Prefix beam search over CTC frame posteriors (module docstring).

    Args:
        log_probs: ``(B, T, V)`` log-softmax outputs, blank at id ``blank`` (0: the labels are
            ids ``1 .. V-1``, as everywhere in cbasr).
        lens: ``(B,)`` valid frames.
        options: beam, n-best, weights (``ilm_weight`` must be 0).
        lm: external LM for shallow fusion.

    Returns:
        Per utterance, its hypotheses best first.
    """
    if blank != 0:
        raise ValueError("cbasr's vocabularies put the blank at id 0")
    if options.ilm_weight != 0:
        raise ValueError("ilm_weight (HAT eq. 9's lambda_2) applies to HAT models only")
    B, T, V = log_probs.shape
    if B == 0:
        return []
    device = log_probs.device
    dtype = torch.promote_types(log_probs.dtype, torch.float32)
    lens = lens.to(device)
    width = 1
    scores = PrefixScores(B, dtype, device)
    p_b = torch.zeros(B, dtype=dtype, device=device)  # the empty prefix: probability 1
    p_nb = torch.full((B,), _NEG_INF, dtype=dtype, device=device)
    last = torch.zeros(B, dtype=torch.long, device=device)  # last label (0: none)
    prefixes: list = [()] * B
    lm_state = lm.begin(B, device) if lm is not None else None
    labels_row = torch.arange(1, V, device=device)  # (V - 1,)
    for t in range(T):
        utt = utterance_rows(B, width, device)
        lp = log_probs[:, t].to(dtype).index_select(0, utt)  # (B, V) -> (N, V)
        active = (t < lens).index_select(0, utt)  # (N,)
        both = torch.logaddexp(p_b, p_nb)
        stay_b = both + lp[:, 0]
        stay_nb = torch.where(last > 0, p_nb + lp.gather(1, last[:, None]).squeeze(1), _NEG_INF)
        repeat = labels_row[None, :] == last[:, None]  # (N, V - 1)
        ext = torch.where(repeat, p_b[:, None], both[:, None]) + lp[:, 1:]  # (N, V - 1)
        stay_b = torch.where(active, stay_b, p_b)
        stay_nb = torch.where(active, stay_nb, p_nb)
        ext = ext.masked_fill(~active[:, None], _NEG_INF)
        rows, parents, labels = extension_pairs(prefixes, B, width)
        if rows:
            rows = torch.tensor(rows, device=device)
            parents, cols = (
                torch.tensor(parents, device=device),
                torch.tensor(labels, device=device) - 1,
            )
            stay_nb[rows] = torch.logaddexp(stay_nb[rows], ext[parents, cols])
            ext[parents, cols] = _NEG_INF
        lm_lp = lm_state["log_probs"].to(dtype) if lm is not None else None
        extend = fused_extensions(scores.fused, options, V - 1, lm_lp)  # (N, V - 1)
        stay = torch.logaddexp(stay_b, stay_nb)
        # (N, V): column 0 stays
        total = torch.cat(
            [(options.am_weight * stay + scores.fused)[:, None], options.am_weight * ext + extend],
            dim=1,
        )
        values, index, new_width = select(total.view(B, width * V), options.beam)
        parent = (
            (torch.arange(B, device=device) * width)[:, None] + index // V
        ).flatten()  # (B W,)
        col = (index % V).flatten()
        alive = torch.isfinite(values).flatten()
        emitted = (col > 0) & alive
        label = torch.where(emitted, col, 1)
        p_b = torch.where(emitted | ~alive, _NEG_INF, stay_b[parent])
        p_nb = torch.where(
            emitted, ext[parent].gather(1, (label - 1)[:, None]).squeeze(1), stay_nb[parent]
        )
        p_nb = p_nb.masked_fill(~alive, _NEG_INF)
        new = next_scores(scores, parent, emitted, label, torch.logaddexp(p_b, p_nb), extend, lm_lp)
        last = torch.where(emitted, col, last[parent])
        prefixes = next_prefixes(prefixes, parent, col, alive)
        if lm is not None:
            lm_state = lm.advance(lm.reorder(lm_state, parent), emitted, label)
        scores, width = new, new_width
    eos = lm_state["eos"].to(dtype) if lm is not None else None
    return finalize(
        prefixes, scores.am, scores.fused, scores.lm, scores.ilm, eos, B, width, options
    )
