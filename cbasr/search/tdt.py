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
Every label extension is a new prefix within a step, so each step keeps only its ``beam`` best
label extensions per duration (a pruned beam could keep no others on frame ``t``). Without
pruning (``beam=None``) and with ``max_symbols`` at least the number of labels, every
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


def _cat_states(states: list):
    """One batched prediction-network state of single-prefix states (LSTM ``(h, c)`` tuples
    along dim 1, label windows along dim 0, or None for a state-free network)."""
    if states[0] is None:
        return None
    if isinstance(states[0], tuple):
        return tuple(torch.cat(parts, dim=1) for parts in zip(*states))
    return torch.cat(states, dim=0)


def _split_states(state, n: int) -> list:
    if state is None:
        return [None] * n
    if isinstance(state, tuple):
        return [tuple(part[:, i : i + 1] for part in state) for i in range(n)]
    return [state[i : i + 1] for i in range(n)]


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

    def read(prefixes: list[tuple]) -> torch.Tensor:
        """``g (N, H)`` of ``prefixes``, the new ones (their parents read) in one batched step."""
        new = [prefix for prefix in dict.fromkeys(prefixes) if prefix not in contexts]
        if new:
            labels = torch.tensor([prefix[-1] for prefix in new], device=h.device)
            parents = _cat_states([contexts[prefix[:-1]][1] for prefix in new])
            g, states = decoder.prediction.step(labels, parents)
            for i, (prefix, state) in enumerate(zip(new, _split_states(states, len(new)))):
                contexts[prefix] = (g[i : i + 1], state)
        return torch.cat([contexts[prefix][0] for prefix in prefixes])

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
            g = read(prefixes)  # (N, H)
            units = joint.out(enc[t][None] + joint.label_proj(g))
            tokens, durs = joint.frame_tokens_durations(units)
            masses = torch.tensor([mass for _, mass in current], dtype=torch.float64)
            tokens, durs = tokens.double(), durs.double()
            stay: dict[tuple, float] = {}
            for k, d in enumerate(durations):
                if d > 0 and t + d <= T:  # blanks: one per hypothesis
                    target = finished if t + d == T else waiting[t + d]
                    blanks = (masses + tokens[:, 0] + durs[:, k]).tolist()
                    for prefix, score in zip(prefixes, blanks):
                        target[prefix] = _log_add(target.get(prefix, -math.inf), score)
                if (d == 0 and s == max_symbols) or t + d >= T:
                    continue  # labels: past the cap, or landing off the frames (a dead end)
                labels = masses[:, None] + tokens[:, 1:] + durs[:, k, None]  # (N, V - 1)
                flat = labels.flatten()
                if options.beam is not None and flat.numel() > options.beam:
                    # each extension is a new prefix here: the beam best of them are the
                    # only ones a pruned beam can keep on frame t (d = 0), and the ones kept
                    # of this step for frame t + d
                    picked = flat.topk(options.beam)
                    values, index = picked.values.tolist(), picked.indices.tolist()
                else:
                    values, index = flat.tolist(), range(flat.numel())
                target = stay if d == 0 else waiting[t + d]
                for score, i in zip(values, index):
                    n, label = divmod(i, labels.shape[1])
                    extended = prefixes[n] + (label + 1,)
                    target[extended] = _log_add(target.get(extended, -math.inf), score)
            current = _best(stay, options.beam, options)
    hypotheses = []
    for prefix, am in finished.items():
        score = options.am_weight * am + options.label_bonus * len(prefix)
        if options.length_norm:
            score /= max(len(prefix), 1)
        hypotheses.append(Hypothesis(list(prefix), score, am))
    hypotheses.sort(key=lambda hyp: -hyp.score)
    return hypotheses if options.nbest is None else hypotheses[: options.nbest]
