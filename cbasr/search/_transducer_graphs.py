"""The transducer beam search with its prefixes on the device as static steps, replayed from
CUDA graphs captured once per padded batch shape (``merge="graphs"``), and the cache of the
captured searches."""

import dataclasses
from typing import TYPE_CHECKING

import torch

from cbasr.models.transducer_greedy import capture, static_runs
from cbasr.search._prefix_tables import _DevicePrefixes
from cbasr.search.prefix import PrefixScores
from cbasr.search.rows import DecoderRows, utterance_rows

if TYPE_CHECKING:
    from cbasr.search.transducer import _Frames

__all__ = ["clear_graphs"]


class _StaticSearch:
    """The search with its prefixes on the device (:class:`_DevicePrefixes`) as two steps of
    a batch shape's variables: the start, and a frame (its index a device counter, its records
    written into a buffer). With ``graphs`` they run on static variables
    (:func:`~cbasr.models.transducer_greedy.static_runs`), replayed from CUDA graphs, one
    launch a frame (``static``: the same static steps run eagerly, on any device: their
    bookkeeping, testable without a GPU); else eagerly, each step's values passed on. The
    host reads the device once, after the last frame."""

    def __init__(
        self,
        frames: "_Frames",
        h: torch.Tensor,
        lens: torch.Tensor,
        per_utterance,
        graphs: bool,
        static: bool = False,
    ):
        decoder, options, lm, B = frames.decoder, frames.options, frames.lm, frames.batch
        W, device = options.beam, h.device
        self.h, self.lens, self.frames = h, lens.clone(), frames
        self.prefixes = prefixes = _DevicePrefixes(B, options, frames.dtype, device)
        steps = 1 + 2 * options.max_symbols
        prefixes.buffer = torch.zeros(h.shape[1], steps, B * W, dtype=torch.long, device=device)
        h, lens = self.h, self.lens

        def variables(t, rows, scores, prefix, lm_state) -> dict:
            v = {
                "t": t,
                "expanded": rows.expanded,
                "dynamic": rows.dynamic,
                "scores": [scores.am, scores.fused, scores.lm, scores.ilm],
                "prefix": prefix,
            }
            if lm is not None:  # (the variables hold tensors only)
                v["lm"] = lm_state
            return v

        def first(v):
            rows = DecoderRows(decoder, decoder.begin(h, lens), B, W, per_utterance, device)
            t = torch.zeros((), dtype=torch.long, device=device)
            prefix = [torch.zeros_like(prefixes.hash), torch.zeros_like(prefixes.length)]
            lm_state = None
            if lm is not None:
                lm_state = lm.reorder(lm.begin(B, device), utterance_rows(B, W, device))
            return variables(t, rows, prefixes.start_scores(), prefix, lm_state)

        def frame(v):
            rows = DecoderRows.restore(decoder, B, W, v["expanded"], v["dynamic"])
            scores = PrefixScores(0, frames.dtype, device)
            scores.am, scores.fused, scores.lm, scores.ilm = v["scores"]
            prefixes.hash, prefixes.length = v["prefix"]
            scores, _, lm_state = frames(v["t"], lens, rows, prefixes, scores, W, v.get("lm"))
            prefix = [prefixes.hash, prefixes.length]
            return variables(v["t"] + 1, rows, scores, prefix, lm_state)

        self.phases, self.static = (first, frame), static or graphs
        if self.static:
            self.v, self.runs = static_runs([first, frame], first(None))
            self.steps = capture(self.runs, device) if graphs else self.runs

    def search(self, h: torch.Tensor, lens: torch.Tensor):
        """``(prefixes, scores, LM state)`` of the final beam, for :func:`finalize`."""
        T = h.shape[1]
        if h is not self.h:
            self.h[:, :T].copy_(h)
            self.h[:, T:].zero_()
        self.lens.copy_(lens)
        if self.static:  # on the static variables, in place
            first, frame = self.steps
            first()
            for _ in range(T):
                frame()
            v = self.v
        else:  # each step's values passed on (an LM may keep host values: ARPA's histories)
            first, frame = self.phases
            v = first(None)
            for _ in range(T):
                v = frame(v)
        scores = PrefixScores(0, self.frames.dtype, self.h.device)
        scores.am, scores.fused, scores.lm, scores.ilm = v["scores"]
        return self.prefixes.final(T), scores, v.get("lm")


# the captured searches, the newest last: each holds its decoder and LM, so an id in a key is
# never another object's; a search dropped is freed at once (nothing refers back to it)
_GRAPHS: dict = {}
GRAPH_SHAPES = 8  # searches kept, decoders and batch shapes together
GRAPH_BUCKET = 64  # frames are padded to a multiple of this, so that batches share graphs
CAPTURE = True  # False: merge="graphs" runs the same static steps eagerly, on any device (tests)


def clear_graphs() -> None:
    """Drop every captured beam search (their graphs, static tensors and memory pools)."""
    _GRAPHS.clear()


def _pointers(module) -> tuple:
    """Where a module's parameters live: moved or replaced, a graph must be captured anew."""
    return tuple(p.data_ptr() for p in module.parameters()) if module is not None else ()


def _graphed(frames: "_Frames", h: torch.Tensor, lens: torch.Tensor, per_utterance):
    """The captured search of ``h``'s padded shape, captured on first use."""
    decoder, lm = frames.decoder, frames.lm
    padded = -(-h.shape[1] // GRAPH_BUCKET) * GRAPH_BUCKET
    lm_model = getattr(lm, "model", None)
    key = (
        h.shape[0],
        padded,
        h.shape[2:],
        h.dtype,
        h.device,
        # what the search computes with (not nbest, length_norm: applied after it)
        dataclasses.replace(frames.options, nbest=None, length_norm=False, merge="graphs"),
        frames.monotonic,
        frames.masked,
        per_utterance,
        torch.is_autocast_enabled("cuda"),
        torch.get_autocast_dtype("cuda"),
        torch.is_inference_mode_enabled(),  # (its tensors take no in-place update outside)
        id(decoder),
        _pointers(decoder),
        id(lm),
        _pointers(lm_model if isinstance(lm_model, torch.nn.Module) else None),
    )
    found = _GRAPHS.pop(key, None)
    if found is None:
        while len(_GRAPHS) >= GRAPH_SHAPES:
            _GRAPHS.pop(next(iter(_GRAPHS)))
        found = _StaticSearch(frames, h.new_zeros(h.shape[0], padded, *h.shape[2:]), lens,
                              per_utterance, graphs=CAPTURE, static=True)  # fmt: skip
    _GRAPHS[key] = found
    return found
