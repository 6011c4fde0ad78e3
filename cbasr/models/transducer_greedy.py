"""Greedy searches of the transducers: frame-looping and label-looping, and TDT's.

Both RNN-T / HAT searches take the same decisions, utterance by utterance: on frame ``t``, with
``s`` labels already emitted there, emit the best label where it beats the blank (``rule
"label"``; ``"emission"``: where the labels' summed probability does) while ``s <
max_symbols``, else move on a frame. They differ in how a batch walks through them:

- :func:`frame_looping_greedy`: every utterance on the same frame; per frame, the joint, and
  while some utterance emits, the prediction network on the emitting rows and the joint again.
  Each step reads on the host which rows emitted.
- :func:`label_looping_greedy` (Bataev et al. 2024, "Label-Looping: Highly Efficient Decoding
  for Transducers", arXiv:2406.06220, Algorithm 1): every utterance on a frame of its own. An
  outer loop emits one label per utterance; inside it, the utterances whose blank wins move on
  frames, and only they, until each has found a label or run out of frames. The prediction
  network then runs once per outer step, for the batch. As the prefix does not change while
  the blank wins, the joint looks at several frames per inner step (4, then 8, 16...: a
  batched call), so an inner loop is usually one step; Bataev et al. step one frame at a time
  and replay the loops from CUDA graphs instead.
  Nothing is read on the host but the two loops' conditions: the emitted labels are written
  into a device buffer, and the prediction network steps every row under a mask
  (:meth:`TransducerDecoder.commit_masked`).

On a GPU a search's cost is the host's: the kernels it queues and the times it waits for the
device. Frame-looping waits about ``T + U`` times per batch (``T`` frames, ``U`` labels of the
longest hypothesis), label-looping about ``U``, with fewer kernels (``scripts/count_launches.py
--greedy`` counts both). Their hypotheses are the same (``tests/models/test_transducer_greedy.py``).
"""

import torch

__all__ = ["frame_looping_greedy", "label_looping_greedy", "tdt_greedy", "MAX_WINDOW"]

MAX_WINDOW = 64  # frames label-looping's joint looks at in one step, once the window has grown


def _best(labels: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(score compared with the blank's, best label index)`` of ``labels (B, V - 1)``."""
    best, index = labels.max(dim=-1)
    return (labels.logsumexp(dim=-1) if rule == "emission" else best), index


def frame_looping_greedy(decoder, h, lens, max_symbols: int, rule: str) -> list[list[int]]:
    """The frame-synchronous greedy search (see the module docstring)."""
    state = decoder.begin(h, lens)
    hyps: list[list[int]] = [[] for _ in range(h.shape[0])]
    for t in range(int(lens.max()) if lens.numel() else 0):
        active = t < lens
        for _ in range(max_symbols):
            blank, labels = decoder.frame_scores(state, t)  # (B,), (B, V - 1)
            emit, index = _best(labels, rule)
            emitted = active & (emit > blank)
            if not bool(emitted.any()):
                break
            state = decoder.commit(state, emitted, index + 1)
            for b in emitted.nonzero().flatten().tolist():
                hyps[b].append(int(index[b]) + 1)
            active = emitted
    return hyps


def _collect(out: torch.Tensor, count: torch.Tensor) -> list[list[int]]:
    """Rows of the device buffer ``out (B, N)`` up to ``count (B,)``, read at once."""
    return [row[:n] for row, n in zip(out.tolist(), count.tolist())]


def label_looping_greedy(
    decoder, h, lens, max_symbols: int, rule: str, window: int = 4
) -> list[list[int]]:
    """The label-looping greedy search (see the module docstring): each outer step finds every
    utterance's next label, looking at ``window`` frames at once from its current frame (the
    prefix does not change while the blank wins, so the joint of those frames is one batched
    call), then ``2 window``, ``4 window``... (at most :data:`MAX_WINDOW` frames, or ``window``
    if larger) past them while some utterance has found none."""
    if window < 1:
        raise ValueError(f"window must be >= 1 frame, got {window}")
    B, T = h.shape[:2]
    device = h.device
    state = decoder.begin(h, lens)
    lens = lens.to(device)
    t = torch.zeros(B, dtype=torch.long, device=device)
    symbols = torch.zeros_like(t)  # labels emitted on the current frame
    out = torch.zeros(B, T * max_symbols + 1, dtype=torch.long, device=device)
    count = torch.zeros_like(t)
    steps = torch.arange(max(T, 1), device=device)
    widest = min(max(window, MAX_WINDOW), max(T, 1))  # the joint's memory: B x widest units
    ends = lens.unsqueeze(1)
    while True:
        looking = t < lens
        found = torch.zeros_like(looking)
        index = torch.zeros_like(t)
        width, searched = window, False
        while bool(looking.any()):  # the rows still without a label look at the next frames
            searched = True
            frames = t.unsqueeze(1) + steps[:width]  # (B, width)
            blank, labels = decoder.frame_scores(state, frames)
            emit, best = _best(labels, rule)
            hit = looking.unsqueeze(1) & (emit > blank) & (frames < ends)
            hit_any = hit.any(dim=1)
            first = hit.int().argmax(dim=1)  # the first frame whose label beats the blank
            index = torch.where(hit_any, best.gather(1, first.unsqueeze(1)).squeeze(1), index)
            # a row that moves on (its label on a later frame, or none here) starts it afresh
            symbols = torch.where(looking & ((first > 0) | ~hit_any), 0, symbols)
            t = torch.where(hit_any, t + first, torch.where(looking, t + width, t))
            found = found | hit_any
            looking = looking & ~hit_any & (t < lens)
            width = min(2 * width, widest)
        if not searched:  # every row has run out of frames
            break
        # every row found a label or ran out of frames: emit, one prediction step for all
        out.scatter_(1, count.unsqueeze(1), (index + 1).unsqueeze(1))
        count = count + found
        state = decoder.commit_masked(state, found, index + 1)
        symbols = symbols + found
        full = symbols >= max_symbols
        t, symbols = t + full, symbols.masked_fill(full, 0)
    return _collect(out, count)


def tdt_greedy(decoder, h, lens, max_symbols: int) -> list[list[int]]:
    """TDT's greedy search (Xu et al. 2023, arXiv:2304.06795, Algorithm 2), label-looping
    too: every utterance on a frame of its own. The best token and the best duration; a label
    is emitted; the search moves on by the duration, a blank by its best duration of at least
    one frame (a blank of duration 0 is no edge), and after ``max_symbols`` labels of duration
    0 on one frame by one. One host read per step (the loop's condition)."""
    joint = decoder.joint
    state = decoder.begin(h, lens)
    B, T = h.shape[:2]
    device = h.device
    durations = torch.tensor(joint.durations, device=device)
    stays = durations == 0
    t = torch.zeros(B, dtype=torch.long, device=device)
    symbols = torch.zeros_like(t)
    lens = lens.to(device)
    most = T * max_symbols + T + 1  # labels of duration 0 capped per frame, one per moving step
    out = torch.zeros(B, most, dtype=torch.long, device=device)
    count = torch.zeros_like(t)
    while bool((active := t < lens).any()):
        tokens, durs = joint.frame_tokens_durations(joint.frame_units(state, t, state["g"]))
        token = tokens.argmax(dim=-1)
        blank = token == 0
        step = torch.where(
            blank, durs.masked_fill(stays, float("-inf")).argmax(dim=-1), durs.argmax(dim=-1)
        )
        d = durations[step]
        emitted = active & ~blank
        out.scatter_(1, count.unsqueeze(1), token.unsqueeze(1))
        count = count + emitted
        state = decoder.commit_masked(state, emitted, token)
        symbols = torch.where(emitted & (d == 0), symbols + 1, 0)
        moved_on = symbols >= max_symbols
        d = torch.where(moved_on, 1, d)
        symbols = torch.where(moved_on, 0, symbols)
        t = torch.where(active, t + d, t)
    return _collect(out, count)
