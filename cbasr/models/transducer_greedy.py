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
- :class:`LabelLoopingGraphs`: the same steps captured as CUDA graphs once per padded batch
  shape and replayed, one launch per step where the eager step queues about 30 kernels (on an
  H200 8-16x frame-looping's speed where eager label-looping is 1.7-2.4x); the model's default
  on a GPU (``greedy_loop="auto"``).

On a GPU a search's cost is the host's: the kernels it queues and the times it waits for the
device. Frame-looping waits about ``T + U`` times per batch (``T`` frames, ``U`` labels of the
longest hypothesis), label-looping about ``U``, with fewer kernels (``scripts/count_launches.py
--greedy`` counts both). Their hypotheses are the same (``tests/models/test_transducer_greedy.py``).
"""

import itertools
from typing import NamedTuple

import torch

from cbasr.modules.label_context import START

__all__ = [
    "frame_looping_greedy",
    "label_looping_greedy",
    "LabelLoopingGraphs",
    "best_label",
    "Emissions",
    "tdt_greedy",
    "MAX_WINDOW",
    "capture",
    "static_runs",
]

MAX_WINDOW = 64  # frames label-looping's joint looks at in one step, once the window has grown


def best_label(labels: torch.Tensor, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy rule (module docstring): ``(score compared with the blank's, best label
    index)`` of ``labels (B, V - 1)``."""
    best, index = labels.max(dim=-1)
    return (labels.logsumexp(dim=-1) if rule == "emission" else best), index


class Emissions(NamedTuple):
    """A greedy search's labels per utterance and the encoder frame on which each was
    emitted (a streaming encoder's frame is computed once its block of input has arrived:
    when a streaming user sees the label)."""

    labels: list[list[int]]
    frames: list[list[int]]


def frame_looping_greedy(
    decoder, h, lens, max_symbols: int, rule: str, frames: bool = False
) -> list[list[int]] | Emissions:
    """The frame-synchronous greedy search (see the module docstring); with ``frames``, each
    label's frame too (:class:`Emissions`)."""
    state = decoder.begin(h, lens)
    hyps: list[list[int]] = [[] for _ in range(h.shape[0])]
    at: list[list[int]] = [[] for _ in range(h.shape[0])]
    for t in range(int(lens.max()) if lens.numel() else 0):
        active = t < lens
        for _ in range(max_symbols):
            blank, labels = decoder.frame_scores(state, t)  # (B,), (B, V - 1)
            emit, index = best_label(labels, rule)
            emitted = active & (emit > blank)
            if not bool(emitted.any()):
                break
            state = decoder.commit(state, emitted, index + 1)
            for b in emitted.nonzero().flatten().tolist():
                hyps[b].append(int(index[b]) + 1)
                at[b].append(t)
            active = emitted
    return Emissions(hyps, at) if frames else hyps


def _collect(
    out: torch.Tensor, count: torch.Tensor, at: torch.Tensor | None = None
) -> list[list[int]] | Emissions:
    """Rows of the device buffer ``out (B, N)`` up to ``count (B,)``, read at once; with the
    frames ``at (B, N)``, both."""
    n = count.tolist()
    labels = [row[:k] for row, k in zip(out.tolist(), n)]
    if at is None:
        return labels
    return Emissions(labels, [row[:k] for row, k in zip(at.tolist(), n)])


# Label-looping's steps, each a function of the loop's variables ``v`` (a dict of tensors, the
# decoder's state under "state") returning them updated: run in turn by the eager loop, or
# each captured once as a CUDA graph and replayed (:class:`LabelLoopingGraphs`).


def _loop_begin(decoder, h: torch.Tensor, lens: torch.Tensor, max_symbols: int) -> dict:
    B, T = h.shape[:2]
    t = torch.zeros(B, dtype=torch.long, device=h.device)
    return {
        "state": decoder.begin(h, lens),
        "lens": lens.to(h.device),
        "t": t,
        "symbols": torch.zeros_like(t),  # labels emitted on the current frame
        "out": torch.zeros(B, T * max_symbols + 1, dtype=torch.long, device=h.device),
        "at": torch.zeros(B, T * max_symbols + 1, dtype=torch.long, device=h.device),
        "count": torch.zeros_like(t),
    }


def _loop_start(v: dict) -> dict:
    """An outer step begins: the rows with frames left look for their next label."""
    looking = v["t"] < v["lens"]
    return {
        **v,
        "looking": looking,
        "found": torch.zeros_like(looking),
        "index": torch.zeros_like(v["t"]),
        "more": looking.any(),
    }


def _loop_look(decoder, v: dict, steps: torch.Tensor, rule: str) -> dict:
    """An inner step: the rows still looking try the next ``len(steps)`` frames at once."""
    t, looking, symbols = v["t"], v["looking"], v["symbols"]
    frames = t.unsqueeze(1) + steps  # (B, width)
    blank, labels = decoder.frame_scores(v["state"], frames)
    emit, best = best_label(labels, rule)
    hit = looking.unsqueeze(1) & (emit > blank) & (frames < v["lens"].unsqueeze(1))
    hit_any = hit.any(dim=1)
    first = hit.int().argmax(dim=1)  # the first frame whose label beats the blank
    index = torch.where(hit_any, best.gather(1, first.unsqueeze(1)).squeeze(1), v["index"])
    # a row that moves on (its label on a later frame, or none here) starts it afresh
    symbols = torch.where(looking & ((first > 0) | ~hit_any), 0, symbols)
    t = torch.where(hit_any, t + first, torch.where(looking, t + steps.shape[0], t))
    looking = looking & ~hit_any & (t < v["lens"])
    found = v["found"] | hit_any
    return {
        **v,
        "t": t,
        "symbols": symbols,
        "index": index,
        "found": found,
        "looking": looking,
        "more": looking.any(),
    }


def _loop_commit(decoder, v: dict, max_symbols: int) -> dict:
    """Every row found a label or ran out of frames: emit, one prediction step for all."""
    found, index = v["found"], v["index"]
    slot = v["count"].unsqueeze(1)
    out = v["out"].scatter(1, slot, (index + 1).unsqueeze(1))
    at = v["at"].scatter(1, slot, v["t"].unsqueeze(1))
    state = decoder.commit_masked(dict(v["state"]), found, index + 1)
    symbols = v["symbols"] + found
    full = symbols >= max_symbols
    return {
        **v,
        "state": state,
        "out": out,
        "at": at,
        "count": v["count"] + found,
        "t": v["t"] + full,
        "symbols": symbols.masked_fill(full, 0),
    }


def _widths(window: int, T: int):
    """The inner steps' frame counts: ``window``, twice that, ... up to the widest, then it."""
    widest = min(max(window, MAX_WINDOW), max(T, 1))  # the joint's memory: B x widest units
    width = window
    while True:
        yield width
        width = min(2 * width, widest)


def label_looping_greedy(
    decoder, h, lens, max_symbols: int, rule: str, window: int = 4, frames: bool = False
) -> list[list[int]] | Emissions:
    """The label-looping greedy search (see the module docstring): each outer step finds every
    utterance's next label, looking at ``window`` frames at once from its current frame (the
    prefix does not change while the blank wins, so the joint of those frames is one batched
    call), then ``2 window``, ``4 window``... (at most :data:`MAX_WINDOW` frames, or ``window``
    if larger) past them while some utterance has found none. With ``frames``, each label's
    frame too (:class:`Emissions`)."""
    if window < 1:
        raise ValueError(f"window must be >= 1 frame, got {window}")
    steps = torch.arange(max(h.shape[1], 1), device=h.device)
    v = _loop_begin(decoder, h, lens, max_symbols)
    while bool((v := _loop_start(v))["more"]):
        for width in _widths(window, h.shape[1]):
            v = _loop_look(decoder, v, steps[:width], rule)
            if not bool(v["more"]):
                break
        v = _loop_commit(decoder, v, max_symbols)
    return _collect(v["out"], v["count"], v["at"] if frames else None)


class LabelLoopingGraphs:
    """:func:`label_looping_greedy` with its steps replayed from CUDA graphs: per batch shape,
    three kinds of step are captured once (the search's start; an inner step per frame window;
    an outer step's commit with the next one's start) and replayed after, each one launch
    where the eager step queues tens of kernels. The host still reads one flag per step of the
    two loops, as the eager search does (Bataev et al. 2024 replace those reads with CUDA's
    conditional nodes). The same hypotheses as the eager search.

    Frames are padded to a multiple of ``bucket`` (the padding is never looked at: every frame
    past an utterance's length is), so batches of similar length share graphs; the graphs of
    the last ``shapes`` shapes are kept. A decoder in training mode (dropout), or a batch with
    no frames, runs the eager search. CUDA only: on another device it says so. With
    ``graphs=False`` the same steps on the same static tensors run eagerly instead of being
    captured, on any device: the search's bookkeeping, testable without a GPU.
    """

    def __init__(
        self,
        decoder,
        max_symbols: int,
        rule: str,
        window: int = 4,
        bucket: int = 64,
        shapes: int = 8,
        graphs: bool = True,
    ):
        if window < 1 or bucket < 1 or shapes < 1:
            raise ValueError(
                f"window, bucket and shapes must be >= 1, got {window}, {bucket}, {shapes}"
            )
        self.decoder, self.max_symbols, self.rule = decoder, max_symbols, rule
        self.window, self.bucket, self.shapes = window, bucket, shapes
        self.graphs = graphs
        self._captured: dict = {}  # key -> _Captured, oldest first

    def __call__(
        self, h: torch.Tensor, lens: torch.Tensor, frames: bool = False
    ) -> list[list[int]] | Emissions:
        if self.graphs and h.device.type != "cuda":
            raise ValueError(
                f"greedy_loop='graphs' replays CUDA graphs and needs a CUDA device, not "
                f"{h.device}: use greedy_loop='label' (the same search, eager) there"
            )
        B, T = h.shape[:2]
        if self.decoder.training or B == 0 or T == 0:
            return label_looping_greedy(
                self.decoder, h, lens, self.max_symbols, self.rule, self.window, frames
            )
        padded = -(-T // self.bucket) * self.bucket
        key = (
            B,
            padded,
            h.shape[2:],
            h.dtype,
            h.device,
            torch.is_autocast_enabled("cuda"),
            torch.is_inference_mode_enabled(),  # (its tensors take no in-place update outside)
            tuple(p.data_ptr() for p in self.decoder.parameters()),  # moved or replaced: anew
        )
        captured = self._captured.pop(key, None)
        if captured is None:
            if len(self._captured) >= self.shapes:
                self._captured.pop(next(iter(self._captured)))
            captured = _Captured(self, h.new_zeros(B, padded, *h.shape[2:]), lens.to(h.device))
        self._captured[key] = captured  # the newest last
        return captured.decode(h, lens, frames)


def capture(runs: list, device: torch.device) -> list:
    """The CUDA graphs of ``runs`` (functions of no argument that write into tensors they
    hold), as their replays; each run first once on a side stream, as CUDA asks, then
    captured. They share a memory pool: they never run at the same time, and nothing that
    one leaves in the pool is read by another (what persists is in the static tensors)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for run in runs:
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    pool = torch.cuda.graph_pool_handle()
    replays = []
    for run in runs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            run()
        replays.append(graph.replay)
    return replays


def static_runs(phases: list, first):
    """A loop's variables as static tensors, and its phases as runs on them.

    Args:
        phases: functions of the variables (a pytree of tensors) returning their next values,
            of the same structure.
        first: the variables' first values (cloned, each a tensor of its own).

    Returns:
        ``(variables, runs)``: each run calls its phase on ``variables`` and writes the results
        into them (what a phase returns unchanged is not copied), so that it can be captured as
        a CUDA graph (:func:`capture`) or run as it is, eagerly.
    """
    from torch.utils import _pytree

    variables = _pytree.tree_map(torch.clone, first)
    statics, spec = _pytree.tree_flatten(variables)

    def in_place(phase):
        def run():
            values, out_spec = _pytree.tree_flatten(phase(_pytree.tree_unflatten(statics, spec)))
            if out_spec != spec:
                raise RuntimeError(f"a step changed the loop's variables: {out_spec}")
            for static, value in zip(statics, values):
                if value is not static:
                    static.copy_(value)

        return run

    return variables, [in_place(phase) for phase in phases]


class _Captured:
    """The CUDA graphs of :class:`LabelLoopingGraphs` for one batch shape, with the static
    tensors they read and write: the input ``h``, ``lens`` and the loop's variables."""

    def __init__(self, search: LabelLoopingGraphs, h: torch.Tensor, lens: torch.Tensor):
        decoder, cap, rule = search.decoder, search.max_symbols, search.rule
        self.h, self.lens = h, lens.clone()
        steps = torch.arange(h.shape[1], device=h.device)
        self.widths = []
        for width in _widths(search.window, h.shape[1]):
            if self.widths and width == self.widths[-1]:
                break
            self.widths.append(width)

        # (no closure holds self: the graphs of an evicted shape are freed on the spot, not
        # by the garbage collector, which may run while another shape is being captured, when
        # CUDA refuses to destroy a graph)
        h, lens = self.h, self.lens

        def first(v):
            return _loop_start(_loop_begin(decoder, h, lens, cap))

        def look(width):
            return lambda v: _loop_look(decoder, v, steps[:width], rule)

        def then(v):
            return _loop_start(_loop_commit(decoder, v, cap))

        phases = [first, *map(look, self.widths), then]
        with torch.no_grad():
            # the static variables, each a tensor of its own: every step writes into them;
            # the runs hold what the graphs read besides them (the frame offsets, the
            # decoder): kept for as long as the graphs are
            self.v, self.runs = static_runs(phases, first(None))
            self.steps = self.runs if not search.graphs else capture(self.runs, h.device)

    @torch.no_grad()
    def decode(
        self, h: torch.Tensor, lens: torch.Tensor, frames: bool
    ) -> list[list[int]] | Emissions:
        T = h.shape[1]
        self.h[:, :T].copy_(h)
        self.h[:, T:].zero_()
        self.lens.copy_(lens)
        first, *looks, then = self.steps
        more = self.v["more"]
        first()
        while bool(more):
            for i in itertools.count():
                looks[min(i, len(looks) - 1)]()
                if not bool(more):
                    break
            then()
        return _collect(self.v["out"], self.v["count"], self.v["at"] if frames else None)


def tdt_greedy(
    decoder, h, lens, max_symbols: int, frames: bool = False, masked: bool | None = None
) -> list[list[int]] | Emissions:
    """TDT's greedy search (Xu et al. 2023, arXiv:2304.06795, Algorithm 2): every utterance
    on a frame of its own. On a frame, the best token and the best duration; a label is
    emitted and the search moves on by its duration, a blank by its best duration of at least
    one frame (a blank of duration 0 is no edge), and after ``max_symbols`` labels of duration
    0 on one frame by one.

    Each step evaluates the joint once per utterance, on its own frame. The prediction
    network runs once per emitted label, on the rows that emitted (no step where none did),
    while the blanks advance with the joint alone, as label-looping does (Bataev et al. 2024,
    "Label-Looping: Highly Efficient Decoding for Transducers", arXiv:2406.06220, who cover
    TDT too); the projection of a prefix's prediction output is kept until it emits again.
    The encoder side of the joint is projected on the frames the search lands on only, never
    on the frames a token or blank covers. ``masked`` (default: on a GPU) steps every row
    under a mask (:meth:`~cbasr.modules.label_context.LabelContext.step_masked`), reading on
    the host the loop's condition only; else the emitting rows are read and stepped alone
    (:meth:`~cbasr.modules.label_context.LabelContext.step_rows`: on a CPU that read costs
    nothing and only those rows are computed). With ``frames``, each label's frame too
    (:class:`Emissions`)."""
    joint, prediction = decoder.joint, decoder.prediction
    B, T = h.shape[:2]
    device = h.device
    masked = h.is_cuda if masked is None else masked
    g, context = prediction.step(
        torch.full((B,), START, dtype=torch.long, device=device),
        prediction.initial_state(B, device),
    )
    proj = joint.label_proj(g)  # the prefix's side of the joint, kept until it emits
    durations = torch.tensor(joint.durations, device=device)
    stays = durations == 0
    frames_of = h.flatten(0, 1)
    first = torch.arange(B, device=device) * T  # each utterance's frame 0 in frames_of
    t = torch.zeros(B, dtype=torch.long, device=device)  # (past the frames: done, for good)
    symbols = torch.zeros_like(t)  # labels of duration 0 emitted on the current frame
    lens = lens.to(device)
    out = torch.zeros(B, T * max_symbols + 1, dtype=torch.long, device=device)
    at = torch.zeros_like(out)
    count = torch.zeros_like(t)
    while bool((active := t < lens).any()):
        enc = joint.encoder_proj(frames_of.index_select(0, first + t.clamp(max=T - 1)))
        tokens, durs = joint.frame_tokens_durations(joint.out(enc + proj))
        token = tokens.argmax(dim=-1)
        blank = token == 0
        # a blank's best duration of at least one frame, a label's best
        d = durations[durs.masked_fill(blank.unsqueeze(1) & stays, float("-inf")).argmax(dim=-1)]
        emitted = active & ~blank
        if masked or bool(emitted.any()):
            slot = count.unsqueeze(1)
            out.scatter_(1, slot, token.unsqueeze(1))
            at.scatter_(1, slot, t.unsqueeze(1))
            count = count + emitted
            if masked:
                g, context = prediction.step_masked(token, context, emitted)
                proj = torch.where(emitted.unsqueeze(1), joint.label_proj(g), proj)
            else:
                rows = emitted.nonzero().squeeze(1)
                g, context = prediction.step_rows(token, context, rows)
                proj = proj.index_copy(0, rows, joint.label_proj(g))
        symbols = torch.where(emitted & (d == 0), symbols + 1, 0)
        full = symbols >= max_symbols
        t = t + torch.where(full, 1, d)
        symbols = symbols.masked_fill(full, 0)
    return _collect(out, count, at if frames else None)
