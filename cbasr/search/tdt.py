"""Beam search for the token-and-duration transducer (TDT; Xu et al. 2023, arXiv:2304.06795).

A TDT edge takes a token and a duration together (eq. 5): from node ``(t, u)`` a blank of
duration ``d >= 1`` moves to frame ``t + d``, a label of duration ``d >= 0`` emits it and moves
to frame ``t + d``; a path ends with a blank landing exactly on frame ``T``
(:mod:`cbasr.losses.tdt`). The prediction network reads the labels only, so all paths that
reach frame ``t`` with the same prefix continue identically and are summed exactly, as the
transducer search recombines them (HAT paper section 3.3). Frames are visited in order; the
hypotheses waiting on frame ``t`` (``A_t``, each prefix with the log of its summed path mass)
are expanded as

    C_0 = the ``beam`` best of A_t
    for s = 0 .. max_symbols:
        every blank edge and every label edge of duration d >= 1 of C_s is summed into
        A_{t+d} (or, for a blank with t + d = T, into the finished prefixes)
        if s == max_symbols: stop
        C_{s+1} = the ``beam`` best labels of duration 0 of C_s (they stay on frame t)

A hypothesis thus takes at most ``max_symbols`` labels of duration 0 in a row on one frame.
Without pruning (``beam=None``) and with ``max_symbols`` at least the number of labels, every
finished prefix's ``am_score`` is exactly ``log P(y | x) = -tdt_nll`` (tested against the
loss); with pruning it is the mass of the paths the beam kept. Skipping frames is where TDT
saves work: a frame no hypothesis lands on is never evaluated.

Fusion with an external or internal language model is not offered here; ``label_bonus`` and
``length_norm`` are.
"""

import math
from collections import defaultdict

import torch

from cbasr.modules.decoders import TransducerDecoder
from cbasr.search.hypotheses import BeamSearchOptions, Hypothesis

__all__ = ["tdt_beam_search"]


def _log_add(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    top = max(a, b)
    return top + math.log1p(math.exp(-abs(a - b)))


def _best(entries: dict, beam: int | None, options: BeamSearchOptions) -> list:
    """The ``beam`` best ``(prefix, am)`` of ``entries`` by fused score (all when None)."""

    def fused(item) -> float:
        return options.am_weight * item[1] + options.label_bonus * len(item[0])

    ranked = sorted(entries.items(), key=fused, reverse=True)
    return ranked if beam is None else ranked[:beam]


@torch.no_grad()
def tdt_beam_search(
    decoder: TransducerDecoder,
    h: torch.Tensor,
    lens: torch.Tensor,
    options: BeamSearchOptions,
    max_symbols: int,
) -> list[list[Hypothesis]]:
    """N-best hypotheses of each utterance (module docstring), best first.

    Args:
        decoder: a transducer decoder with the TDT joint (``decoder.joint.durations``).
        h: ``(B, T, D)`` encoder states; lens: ``(B,)`` frames.
        options: ``beam``, ``nbest``, ``am_weight``, ``label_bonus``, ``length_norm``.
        max_symbols: most labels of duration 0 in a row on one frame.
    """
    return [
        _search_one(decoder, h[b : b + 1, : int(lens[b])], options, max_symbols)
        for b in range(h.shape[0])
    ]


def _search_one(decoder, h, options: BeamSearchOptions, max_symbols: int) -> list[Hypothesis]:
    joint = decoder.joint
    durations = joint.durations
    T = h.shape[1]
    enc = joint.prepare(h)["enc"][0]  # (T, J)
    begin = decoder.begin(h, torch.tensor([T]))
    contexts = {(): (begin["g"], begin["context"])}  # prefix -> prediction network output, state

    def context(prefix: tuple) -> torch.Tensor:
        if prefix not in contexts:
            context(prefix[:-1])  # the parent's first
            state = contexts[prefix[:-1]][1]
            label = torch.tensor([prefix[-1]], device=h.device)
            contexts[prefix] = decoder.prediction.step(label, state)
        return contexts[prefix][0]

    waiting: dict[int, dict[tuple, float]] = defaultdict(dict)
    waiting[0][()] = 0.0
    finished: dict[tuple, float] = {}
    for t in range(T):
        if t not in waiting:
            continue
        current = _best(waiting.pop(t), options.beam, options)
        for s in range(max_symbols + 1):
            if not current:
                break
            prefixes = [prefix for prefix, _ in current]
            g = torch.cat([context(prefix) for prefix in prefixes])  # (N, H)
            units = joint.out(enc[t][None] + joint.label_proj(g))
            tokens, durs = joint.frame_tokens_durations(units)
            tokens, durs = tokens.double().tolist(), durs.double().tolist()
            stay: dict[tuple, float] = {}
            for (prefix, mass), token, dur in zip(current, tokens, durs):
                for k, d in enumerate(durations):
                    if d > 0:  # blank
                        score = mass + token[0] + dur[k]
                        target = finished if t + d == T else waiting[t + d] if t + d < T else None
                        if target is not None:
                            target[prefix] = _log_add(target.get(prefix, -math.inf), score)
                    for label in range(1, len(token)):
                        score = mass + token[label] + dur[k]
                        extended = prefix + (label,)
                        if d == 0:
                            if s < max_symbols:
                                stay[extended] = _log_add(stay.get(extended, -math.inf), score)
                        elif t + d < T:
                            later = waiting[t + d]
                            later[extended] = _log_add(later.get(extended, -math.inf), score)
            current = _best(stay, options.beam, options)
    hypotheses = []
    for prefix, am in finished.items():
        score = options.am_weight * am + options.label_bonus * len(prefix)
        if options.length_norm:
            score /= max(len(prefix), 1)
        hypotheses.append(Hypothesis(list(prefix), score, am))
    hypotheses.sort(key=lambda hyp: -hyp.score)
    return hypotheses if options.nbest is None else hypotheses[: options.nbest]
