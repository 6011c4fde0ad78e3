"""Label-synchronous beam search for the autoregressive CB decoders (Raffel et al.; Luo et al.).

An :class:`~cbasr.modules.decoders.AutoregressiveDecoder` reads the encoder state at every
earlier emission time, so no two alignments of a label prefix share a decoder state and the
frame-synchronous prefix merging of :mod:`cbasr.search.conditional_bernoulli` is only an
approximation there. This search instead extends hypotheses one *label* at a time. A
hypothesis is a label prefix ``y_1..l`` with its emission times ``t_1 < .. < t_l`` and scores
the joint probability of the frames up to ``t_l`` and the labels (CB paper eq. 4 and section
5.2, decoder 2):

    log P(b_{<=t_l}, y_{<=l}) = sum_{u <= t_l} log P(B_u = b_u | ...) + sum_{i <= l} log P(y_i | t_{<=i}, y_<i)

Each step a hypothesis proposes every next emission frame ``t > t_l`` with every label ``v``:

    + sum_{t_l < u < t} log P(B_u = 0) + log P(B_t = 1) + log P(v | t, t_{<=l}, y_{<=l})

and it ends by emitting nothing more: ``+ sum_{u > t_l} log P(B_u = 0)``. The emission
probabilities come from the encoder alone (``emission="encoder"``) or, for Luo et al.'s
autoregressive emissions, from the encoder and the decoder state after the labels so far
(``s_l``), exactly as in training and in the frame-by-frame decoding (tested against a
step-by-step enumeration). The candidates of all frames are scored at once: the decoder's
first LSTM layer splits into a per-frame input projection, computed once per utterance, plus a
per-hypothesis term, so one step costs ``O(N T H)`` element-wise work for ``N`` hypotheses
(deeper layers are ordinary batched matrix products over ``N T`` rows).

The ``beam`` best extensions (fused score, see :mod:`cbasr.search.hypotheses`) are kept per
utterance. Ended hypotheses are collected; at the end the collected alignments of each label
sequence are summed, so a hypothesis's ``am_score`` is the log of the probability of the
alignments the search found. Every term is a log probability, so extending can only lower a
hypothesis's fused score except by the label bonus; an utterance stops as soon as its best
ended hypothesis beats an upper bound on anything its live hypotheses can still reach
(``beam=None`` never stops early: it enumerates every alignment, so its scores are exactly
``log P(y)`` and its best hypothesis the exact ``argmax_y P(y)``; tested).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cbasr.modules.decoders import AutoregressiveDecoder
from cbasr.modules.label_context import START
from cbasr.search.fusion import LabelScorer
from cbasr.search.hypotheses import BeamSearchOptions, Hypothesis
from cbasr.search.prefix import PrefixScores, fused_extensions, next_prefixes, next_scores, select
from cbasr.search.rows import utterance_rows

__all__ = ["cb_label_beam_search"]

_NEG_INF = float("-inf")


class _FrameScorer:
    """The decoder's label and emission terms of every (hypothesis, frame) pair at once.

    Args:
        decoder: the autoregressive decoder (eval mode).
        h: ``(B, T, D)`` encoder states.
    """

    def __init__(self, decoder: AutoregressiveDecoder, h: torch.Tensor):
        self.decoder, self.h = decoder, h
        rnn = decoder.rnn
        D = h.shape[-1]
        w_ih = rnn.weight_ih_l0  # (4H, D + E): the input is [h_t; embedding]
        self.w_embed = w_ih[:, D:]  # (4H, E)
        # the frame part of layer 0's input gates, biases included: (B, T, 4H)
        self.frame_gates = F.linear(h, w_ih[:, :D], rnn.bias_ih_l0 + rnn.bias_hh_l0)
        if decoder.autoregressive_emissions:
            self.frame_emission = decoder.emission_encoder(h)  # (B, T, E_h)
        else:
            self.emit_logits = decoder.emission(h)  # (B, T)

    @staticmethod
    def _cell(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One LSTM cell (PyTorch's gate order i, f, g, o): ``gates (..., 4H)``, ``c (..., H)``."""
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def labels(
        self, utt: torch.Tensor, prev: torch.Tensor, lstm: tuple[torch.Tensor, torch.Tensor]
    ):
        """For each row ``n`` (of utterance ``utt[n]``, previous label ``prev[n]``, LSTM state
        ``lstm``) and each frame ``t``: the label distribution if the next label is emitted at
        ``t``, and the LSTM state that emission leaves.

        Returns:
            ``(log_probs (N, T, V - 1), top states (N, T, H), (h, c) each (layers, N, T, H))``.
        """
        d, rnn = self.decoder, self.decoder.rnn
        hx, cx = lstm  # (layers, N, H)
        embedded = d.dropout(d.embedding(prev))  # (N, E)
        row_gates = F.linear(embedded, self.w_embed) + F.linear(hx[0], rnn.weight_hh_l0)  # (N, 4H)
        x, c = self._cell(
            self.frame_gates.index_select(0, utt) + row_gates[:, None], cx[0][:, None]
        )
        hs, cs = [x], [c]
        for layer in range(1, d.num_layers):
            # (N, T, 4H)
            gates = (
                F.linear(x, getattr(rnn, f"weight_ih_l{layer}"), getattr(rnn, f"bias_ih_l{layer}"))
                + F.linear(
                    hx[layer],
                    getattr(rnn, f"weight_hh_l{layer}"),
                    getattr(rnn, f"bias_hh_l{layer}"),
                )[:, None]
            )
            x, c = self._cell(gates, cx[layer][:, None])
            hs.append(x), cs.append(c)
        return d.out(x).log_softmax(dim=-1), x, (torch.stack(hs), torch.stack(cs))

    def emissions(self, utt: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """``(N, T)`` emission logits of every frame for each row (top decoder state ``s (N, H)``)."""
        if not self.decoder.autoregressive_emissions:
            return self.emit_logits.index_select(0, utt)
        d = self.decoder
        hidden = torch.tanh(self.frame_emission.index_select(0, utt) + d.emission_state(s)[:, None])
        return d.emission_out(hidden).squeeze(-1)


@dataclass
class _Ended:
    """A label sequence that ended: the acoustic score of each of its alignments found (summed
    at the end), and its fused, end-of-sentence and LM scores (the same for every alignment)."""

    am_scores: list[float]
    fused: float
    eos: float
    lm: float


def _upper_bounds(
    best: torch.Tensor, labels: torch.Tensor, remaining: torch.Tensor, options: BeamSearchOptions
) -> torch.Tensor:
    """The most a live row's descendants can score when they end: ``best (N,)`` its current
    fused score (an upper bound on any of its completions but for the label bonus), ``labels
    (N,)`` its prefix length, ``remaining (N,)`` how many labels it can still emit (>= 1)."""
    bound = best + max(options.label_bonus, 0.0) * remaining.to(best.dtype)  # not float32
    if options.length_norm:
        # a descendant has between labels + 1 and labels + remaining labels
        shortest, longest = (labels + 1).to(bound.dtype), (labels + remaining).to(bound.dtype)
        bound = torch.where(bound > 0, bound / shortest, bound / longest)
    return bound


def _final_score(
    am: float, fused: float, eos: float, length: int, options: BeamSearchOptions
) -> float:
    score = options.am_weight * am + fused + options.lm_weight * eos
    return score / max(length, 1) if options.length_norm else score


@torch.no_grad()
def cb_label_beam_search(
    decoder: AutoregressiveDecoder,
    h: torch.Tensor,
    lens: torch.Tensor,
    options: BeamSearchOptions,
    lm: LabelScorer | None = None,
) -> list[list[Hypothesis]]:
    """Label-synchronous beam search (module docstring).

    Args:
        decoder: an :class:`~cbasr.modules.decoders.AutoregressiveDecoder` (either emission).
        h: ``(B, T, D)`` encoder states; lens: ``(B,)`` valid frames.
        options: beam, n-best, weights (``ilm_weight`` must be 0).
        lm: external LM for shallow fusion (``options.lm_weight``).

    Returns:
        Per utterance, its hypotheses best first (``options.nbest`` of them).
    """
    if not isinstance(decoder, AutoregressiveDecoder):
        raise TypeError(
            f"label-synchronous search needs an autoregressive decoder, got {type(decoder).__name__}"
        )
    if options.ilm_weight != 0:
        raise ValueError("ilm_weight (HAT eq. 9's lambda_2) applies to HAT models only")
    B, T = h.shape[0], h.shape[1]
    if B == 0:
        return []
    device = h.device
    dtype = torch.promote_types(h.dtype, torch.float32)
    lens = lens.to(device)
    scorer = _FrameScorer(decoder, h)
    frames = torch.arange(T, device=device)
    width = 1
    utt = utterance_rows(B, width, device)
    zeros = h.new_zeros(decoder.num_layers, B, decoder.hidden)
    lstm, s = (zeros, zeros.clone()), h.new_zeros(B, decoder.hidden)
    prev = torch.full((B,), START, dtype=torch.long, device=device)
    last = torch.full((B,), -1, dtype=torch.long, device=device)  # t_l of each row (-1: none yet)
    scores = PrefixScores(B, dtype, device)
    scores.am.zero_()
    prefixes: list = [()] * B
    lm_state = lm.begin(B, device) if lm is not None else None
    ended: list[dict[tuple, _Ended]] = [{} for _ in range(B)]  # per utterance, by prefix
    best_ended = torch.full((B,), _NEG_INF, dtype=dtype, device=device)
    for _ in range(T + 1):  # each step emits on a later frame: T + 1 steps end every row
        alive = torch.isfinite(scores.am)
        if not bool(alive.any()):
            break
        row_lens = lens.index_select(0, utt)  # (N,)
        # the frames each row may emit at next: after its last emission, inside the utterance
        # (N, T)
        open_ = (frames[None] > last[:, None]) & (frames[None] < row_lens[:, None]) & alive[:, None]
        a = scorer.emissions(utt, s).to(dtype)  # (N, T)
        stay = F.logsigmoid(-a).masked_fill(~open_, 0.0)
        through = stay.cumsum(dim=1)  # sum of log P(B_u = 0) over open frames u <= t
        gap = through - stay  # ... over open frames u < t
        # the most any pattern of the open frames after t can add: sum of max(log P(B_u = 0),
        # log P(B_u = 1)), label terms being <= 0
        best_frame = torch.maximum(F.logsigmoid(a), F.logsigmoid(-a)).masked_fill(~open_, 0.0)
        # (N, T): frames after t
        future = best_frame.sum(dim=1, keepdim=True) - best_frame.cumsum(dim=1)
        # ending here: no emission on any open frame
        end_am = scores.am + through[:, -1]
        eos = lm_state["eos"].to(dtype) if lm is not None else torch.zeros_like(end_am)
        for r in alive.nonzero().flatten().tolist():
            b = r // width
            entry = ended[b].setdefault(
                prefixes[r], _Ended([], float(scores.fused[r]), float(eos[r]), float(scores.lm[r]))
            )
            entry.am_scores.append(float(end_am[r]))
            final = _final_score(
                float(end_am[r]), entry.fused, entry.eos, len(prefixes[r]), options
            )
            best_ended[b] = max(float(best_ended[b]), final)
        # every next (frame, label)
        # (N, T, V - 1), (N, T, H), (layers, N, T, H)
        label_lp, top, (hx, cx) = scorer.labels(utt, prev, lstm)
        V1 = label_lp.shape[-1]
        emit_am = scores.am[:, None] + gap + F.logsigmoid(a)  # (N, T)
        cand_am = (emit_am[:, :, None] + label_lp.to(dtype)).masked_fill(
            ~open_[:, :, None], _NEG_INF
        )
        lm_lp = lm_state["log_probs"].to(dtype) if lm is not None else None
        extend = fused_extensions(scores.fused, options, V1, lm_lp)  # (N, V - 1)
        # ranked with the frames still to cover, so that hypotheses ending at different frames
        # compare fairly
        # (N, T, V - 1)
        total = options.am_weight * (cand_am + future[:, :, None]) + extend[:, None, :]
        # stop the utterances whose best ended hypothesis no live descendant can beat
        if options.beam is not None:
            remaining = (row_lens - 1 - last).clamp(min=1)
            reach = options.am_weight * (scores.am + best_frame.sum(dim=1)) + scores.fused
            bound = _upper_bounds(
                reach,
                torch.tensor([len(p) if p is not None else 0 for p in prefixes], device=device),
                remaining,
                options,
            )
            bound = bound.masked_fill(~open_.any(dim=1), _NEG_INF).view(B, width).max(dim=1).values
            finished = best_ended >= bound  # (B,)
            total = total.masked_fill(finished[utt][:, None, None], _NEG_INF)
        values, index, new_width = select(total.view(B, width * T * V1), options.beam)
        index, kept = index.flatten(), torch.isfinite(values).flatten()
        if not bool(kept.any()):
            break
        base = (torch.arange(B, device=device) * width).repeat_interleave(new_width)
        parent = base + index // (T * V1)  # (B W',) global rows
        frame, col = (index // V1) % T, index % V1
        labels = col + 1
        am = cand_am[parent, frame, col].masked_fill(~kept, _NEG_INF)
        scores = next_scores(scores, parent, torch.ones_like(kept), labels, am, extend, lm_lp)
        prefixes = next_prefixes(prefixes, parent, labels, kept)
        lstm = (hx[:, parent, frame], cx[:, parent, frame])
        s, prev, last = top[parent, frame], labels, frame
        if lm is not None:
            lm_state = lm.advance(lm.reorder(lm_state, parent), kept, labels)
        width = new_width
        utt = utterance_rows(B, width, device)
    out = []
    for b in range(B):
        hyps = []
        for prefix, entry in ended[b].items():
            am = torch.logsumexp(torch.tensor(entry.am_scores, dtype=torch.float64), dim=0).item()
            hyps.append(
                Hypothesis(
                    list(prefix),
                    _final_score(am, entry.fused, entry.eos, len(prefix), options),
                    am,
                    entry.lm + entry.eos,
                )
            )
        hyps.sort(key=lambda x: x.score, reverse=True)
        out.append(hyps if options.nbest is None else hyps[: options.nbest])
    return out
