"""Time-synchronous beam search for transducers (RNN-T and HAT), with a cap on labels per frame.

The RNN-T lattice (HAT paper section 3.1): at node ``(t, u)`` a hypothesis either takes the
blank to frame ``t + 1`` or emits a label and stays on frame ``t``. The prediction network
reads the labels only, so all paths with the same label prefix continue identically and may
be summed exactly (HAT section 3.3: "paths with equivalent history ... are merged and the
corresponding hypotheses are recombined"). Per frame ``t``, with ``A`` the kept hypotheses
(Saon et al., 2020, "time-synchronous decoding", with joint pruning):

    C = A, D = {}
    for s = 0 .. max_symbols:
        D += C extended by the blank (summed into D's entry for the same prefix)
        if s == max_symbols: stop
        keep the ``beam`` best of D and of C extended by one label; the kept extensions are C
    A = the ``beam`` best of D

A hypothesis of ``D`` holds ``log`` of the summed probability of the paths reaching node
``(t + 1, |y|)`` with prefix ``y`` and at most ``max_symbols`` labels on each frame. Exactness:

- without pruning (``beam=None``) every final hypothesis's ``am_score`` is exactly the log of the
  sum over the lattice paths of ``y`` with at most ``max_symbols`` labels per frame, which is
  ``log P(y | x)`` (``-rnnt_nll``, ``-hat_nll``) when ``|y| <= max_symbols``; tested by
  enumerating the lattice paths;
- on a single frame each ``y`` has one path, so the ``am_score`` of every returned hypothesis is
  exactly ``log P(y | x)`` whatever the beam;
- with ``beam=1`` the joint pruning compares, at each step, the blank with the best label: the
  model's greedy search (:meth:`~cbasr.models.TransducerModel.greedy_decode`), tested.

The one-label-per-frame topology (``monotonic=True``; :mod:`cbasr.losses.transducer`): a label
edge advances the frame, so a hypothesis emits at most one label per frame and takes no blank
after it (``max_symbols`` must be 1): ``D`` gets ``A`` extended by the blank and ``C`` as it is.
The statements above hold with that lattice's ``log P(y | x)`` (tested by enumeration).

Fusion (HAT paper eq. 9): candidates are ranked by ``am_weight * am + lm_weight * lm -
ilm_weight * ilm + label_bonus * |y|``; the internal LM of HAT is ``log softmax(J(g2_u))``
(section 3.2), computed per prefix from the prediction network state.
"""

import torch

from cbasr.modules.decoders import TransducerDecoder
from cbasr.search import _transducer_graphs as graphs
from cbasr.search._prefix_tables import _HostPrefixes
from cbasr.search._transducer_graphs import _graphed, clear_graphs
from cbasr.search.fusion import LabelScorer
from cbasr.search.hypotheses import MERGES, BeamSearchOptions, Hypothesis
from cbasr.search.prefix import (
    PrefixScores,
    finalize,
    fused_extensions,
    next_scores,
    select,
)
from cbasr.search.rows import DecoderRows, cat_rows, reorder_rows, utterance_rows

__all__ = ["transducer_beam_search", "hat_internal_lm_step", "clear_graphs"]

_NEG_INF = float("-inf")


def hat_internal_lm_step(decoder: TransducerDecoder, state: dict) -> torch.Tensor:
    """HAT's internal LM for the next label of each row, ``log softmax(J(g2_u))`` (section 3.2),
    ``(N, V - 1)``: :meth:`TransducerDecoder.internal_lm_log_probs` one step at a time, from the
    prediction network output ``g`` the search state holds (tested equal)."""
    return decoder.internal_lm_step(state["g"])


class _Frames:
    """One frame of the search (module docstring), on either kind of prefixes: what it reads
    besides the search's state (the decoder, the options, the LM)."""

    def __init__(self, decoder, options, lm, monotonic, masked, batch, dtype, device):
        self.decoder, self.options, self.lm, self.monotonic = decoder, options, lm, monotonic
        self.masked, self.batch, self.dtype, self.device = masked, batch, dtype, device
        self.commit = decoder.commit_masked if masked else decoder.commit
        if lm is not None:
            self.advance = lm.advance_masked if masked else lm.advance
        self.use_ilm = options.ilm_weight != 0

    def __call__(
        self,
        t: int | torch.Tensor,
        lens: torch.Tensor,
        rows: DecoderRows,
        beam,
        scores: PrefixScores,
        width: int,
        lm_state: dict | None,
    ) -> tuple[PrefixScores, int, dict | None]:
        """Frame ``t`` (an int, or a 0-d tensor in a static step); ``rows`` and ``beam`` are
        updated in place; returns the next beam's scores, width and LM state."""
        decoder, options, lm, B, dtype = self.decoder, self.options, self.lm, self.batch, self.dtype
        device = self.device
        active_utt = t < lens  # (B,)
        beam.frame(t)
        snapshots, lm_snapshots, offset = [], [], 0
        c_scores, c_width, c_lm = scores, width, lm_state
        for s in range(options.max_symbols + 1):
            state = rows.state
            if self.monotonic and s == options.max_symbols:  # the emission took the frame's edge
                blank_lp = c_scores.am.new_zeros(c_scores.am.shape)
            else:
                # a device counter as each row's frame: indexing by a 0-d tensor reads it
                frame = t if isinstance(t, int) else t.expand(B * c_width)
                blank_lp, label_lp = decoder.frame_scores(state, frame)  # (N,), (N, V - 1)
                V1 = label_lp.shape[1]
                active = active_utt.index_select(0, utterance_rows(B, c_width, device))
                # a finished utterance stays put
                blank_lp = torch.where(active, blank_lp.to(dtype), 0.0)
                label_lp = label_lp.to(dtype).masked_fill(~active[:, None], _NEG_INF)
            snapshots.append(rows.dynamic)
            lm_snapshots.append(c_lm)
            beam.add(c_scores.am + blank_lp, c_scores, c_width, offset)
            offset += B * c_width
            if s == options.max_symbols:
                break
            lm_lp = c_lm["log_probs"].to(dtype) if lm is not None else None
            ilm_lp = hat_internal_lm_step(decoder, state).to(dtype) if self.use_ilm else None
            extend = fused_extensions(c_scores.fused, options, V1, lm_lp, ilm_lp)  # (N, V - 1)
            ext_am = c_scores.am[:, None] + label_lp  # (N, V - 1)
            d_total = beam.totals()  # (B, M)
            M = d_total.shape[1]
            pool = torch.cat(
                [d_total, (options.am_weight * ext_am + extend).view(B, c_width * V1)], dim=1
            )
            values, index, new_width = select(pool, options.beam, stable=True)
            alive = torch.isfinite(values)  # (B, W)
            if not beam.keep(index, alive, M, c_width, V1):
                break
            is_ext = alive & (index >= M)
            flat = (index - M).clamp(min=0)
            parent = ((torch.arange(B, device=device) * c_width)[:, None] + flat // V1).flatten()
            label = (flat % V1 + 1).flatten()
            emitted = is_ext.flatten()
            am = (
                ext_am[parent]
                .gather(1, (label - 1)[:, None])
                .squeeze(1)
                .masked_fill(~emitted, _NEG_INF)
            )
            new = next_scores(c_scores, parent, emitted, label, am, extend, lm_lp, ilm_lp)
            beam.extend(parent, label, emitted)
            rows.reorder(parent, new_width)
            rows.update(self.commit(rows.state, emitted, label))
            if lm is not None:
                c_lm = self.advance(lm.reorder(c_lm, parent), emitted, label)
            c_scores, c_width = new, new_width
        # A = the best of D, each with the decoder and LM state of the sub-step it came from.
        scores, width, source = beam.best()
        rows.replace(decoder.reorder(cat_rows(snapshots), source) if snapshots[0] else {}, width)
        if lm is not None:
            lm_state = reorder_rows(cat_rows(lm_snapshots), source)
        return scores, width, lm_state


@torch.no_grad()
def transducer_beam_search(
    decoder: TransducerDecoder,
    h: torch.Tensor,
    lens: torch.Tensor,
    options: BeamSearchOptions,
    lm: LabelScorer | None = None,
    per_utterance: tuple[str, ...] | None = None,
    monotonic: bool = False,
    masked_commit: bool | None = None,
    merge: str | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over an RNN-T or HAT decoder (module docstring).

    Args:
        decoder: a :class:`~cbasr.modules.decoders.TransducerDecoder`.
        h: ``(B, T, D)`` encoder states; lens: ``(B,)`` valid frames.
        options: ``max_symbols`` is required here; ``ilm_weight`` needs the HAT joint.
        lm: external LM for shallow fusion.
        per_utterance: see :class:`~cbasr.search.rows.DecoderRows` (tests only).
        monotonic: the one-label-per-frame topology (module docstring).
        masked_commit: how the prediction network (and a neural LM) steps the extended rows:
            every row under a mask (:meth:`TransducerDecoder.commit_masked`,
            :meth:`LabelScorer.advance_masked`: no wait for the device to say which rows, the
            default on a GPU and with the prefixes on the device) or the extended rows alone
            (their indices read, the default on a CPU, where that read costs nothing and the
            step is several times smaller). The same hypotheses either way (tested).
        merge: where the prefixes are kept and merged (default: ``options.merge``):
            ``"host"`` (tuples; three reads of the device per sub-step and frame), ``"device"`` (hashes, fixed-width
            beams: :class:`_DevicePrefixes`; one read per batch, every sub-step run) or
            ``"graphs"`` (the same, each frame replayed from a CUDA graph, captured once per
            padded batch shape: CUDA only; a decoder in training mode runs ``"device"``).
            The same hypotheses in each (tested).

    Returns:
        Per utterance, its hypotheses best first.
    """
    if not isinstance(decoder, TransducerDecoder):
        raise TypeError(
            f"transducer_beam_search needs a transducer decoder, got {type(decoder).__name__}"
        )
    if options.max_symbols is None:
        raise ValueError("transducer search needs options.max_symbols (labels per frame)")
    if monotonic and options.max_symbols != 1:
        raise ValueError(
            f"the one-label-per-frame transducer emits at most 1 label per frame; "
            f"got max_symbols={options.max_symbols}"
        )
    if options.ilm_weight != 0 and decoder.joint.name != "hat":
        raise ValueError(
            "ilm_weight (HAT eq. 9's lambda_2) needs the HAT joint: the RNN-T joint has no "
            "internal language model of that form"
        )
    merge = merge or options.merge
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {', '.join(MERGES)}, got {merge!r}")
    if merge != "host" and options.beam is None:
        raise ValueError(f"merge={merge!r} needs a beam width (beam=None: merge='host')")
    if merge == "graphs" and masked_commit is False:
        raise ValueError(
            "merge='graphs' steps the prediction network under a mask: masked_commit=False "
            "reads the extended rows, which a CUDA graph cannot"
        )
    if merge == "graphs" and h.device.type != "cuda" and graphs.CAPTURE:
        raise ValueError(
            f"merge='graphs' replays CUDA graphs and needs a CUDA device, not {h.device}: "
            "use merge='device' (the same search, eager) there"
        )
    if merge == "graphs" and lm is not None and not _tensor_state(lm.begin(1, h.device)):
        raise ValueError(
            f"merge='graphs' needs an LM whose state is tensors (a neural LM); "
            f"{type(lm).__name__} keeps its histories on the host: use merge='device'"
        )
    B, T = h.shape[0], h.shape[1]
    if B == 0:
        return []
    device, dtype = h.device, torch.promote_types(h.dtype, torch.float32)
    lens = lens.to(device)
    if masked_commit is None:
        masked_commit = h.is_cuda or merge != "host"
    frames = _Frames(decoder, options, lm, monotonic, masked_commit, B, dtype, device)
    if merge == "host":
        beam = _HostPrefixes(B, options, dtype, device)
        width = beam.width
        rows = DecoderRows(decoder, decoder.begin(h, lens), B, width, per_utterance, device)
        scores = beam.start_scores()
        lm_state = lm.begin(B, device) if lm is not None else None
        for t in range(T):
            scores, width, lm_state = frames(t, lens, rows, beam, scores, width, lm_state)
        prefixes = beam.final(T)
    else:
        if merge == "graphs" and not decoder.training and T > 0:
            static = _graphed(frames, h, lens, per_utterance)
        else:
            static = graphs._StaticSearch(frames, h, lens, per_utterance, graphs=False)
        prefixes, scores, lm_state = static.search(h, lens)
        width = options.beam
    eos = lm_state["eos"].to(dtype) if lm is not None else None
    return finalize(
        prefixes, scores.am, scores.fused, scores.lm, scores.ilm, eos, B, width, options
    )


def _tensor_state(state) -> bool:
    """Whether an LM state holds tensors only (what a CUDA graph can keep)."""
    from torch.utils import _pytree

    return all(isinstance(x, torch.Tensor) for x in _pytree.tree_leaves(state))
