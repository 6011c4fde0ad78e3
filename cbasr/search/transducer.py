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

import math

import torch

from cbasr.modules.decoders import TransducerDecoder
from cbasr.search.fusion import LabelScorer
from cbasr.search.hypotheses import BeamSearchOptions, Hypothesis
from cbasr.search.prefix import (
    PrefixScores,
    finalize,
    fused_extensions,
    next_prefixes,
    next_scores,
    select,
)
from cbasr.search.rows import DecoderRows, cat_rows, reorder_rows, utterance_rows

__all__ = ["transducer_beam_search", "hat_internal_lm_step"]

_NEG_INF = float("-inf")


def hat_internal_lm_step(decoder: TransducerDecoder, state: dict) -> torch.Tensor:
    """HAT's internal LM for the next label of each row, ``log softmax(J(g2_u))`` (section 3.2),
    ``(N, V - 1)``: :meth:`TransducerDecoder.internal_lm_log_probs` one step at a time, from the
    prediction network output ``g`` the search state holds (tested equal)."""
    return decoder.internal_lm_step(state["g"])


def _read(*tensors: torch.Tensor) -> list:
    """The values of several device tensors of one shape, in one copy to the host (one wait
    for the device where there would be one per tensor), each as ``tolist`` gives it; the
    tensors are cast to the first one's dtype (the searches' indices and flags are exact in
    any of theirs)."""
    first = tensors[0]
    return torch.stack([first, *(t.to(first.dtype) for t in tensors[1:])]).tolist()


def _log_add(a: float, b: float) -> float:
    """``log(exp(a) + exp(b))`` for Python floats."""
    if a < b:
        a, b = b, a
    if b == _NEG_INF:
        return a
    return a + math.log1p(math.exp(b - a))


class _Finished:
    """Hypotheses of one frame that took the blank (``D``), merged by prefix, per utterance.

    Each entry is ``[am, fused, lm, ilm, source row]`` where the source row numbers the row of
    the sub-step snapshots (concatenated) whose decoder and LM state it continues from.
    """

    def __init__(self, batch: int):
        self.entries: list[dict[tuple, list]] = [{} for _ in range(batch)]

    def add(
        self, prefixes: list, am: list, fused: list, lm: list, ilm: list, width: int, offset: int
    ) -> None:
        for r, prefix in enumerate(prefixes):
            if prefix is None or am[r] == _NEG_INF:
                continue
            table = self.entries[r // width]
            entry = table.get(prefix)
            if entry is None:
                table[prefix] = [am[r], fused[r], lm[r], ilm[r], offset + r]
            else:  # another alignment of the same prefix: the same state, probabilities add
                entry[0] = _log_add(entry[0], am[r])

    def totals(
        self, options: BeamSearchOptions, dtype, device
    ) -> tuple[torch.Tensor, list[list[tuple]]]:
        """``(B, M)`` ranking scores of the entries (``-inf`` padding) and their prefixes."""
        keys = [list(table) for table in self.entries]
        width = max(1, max(len(k) for k in keys))
        # one tensor from lists: assigning element by element cost a third of the search
        rows = [
            [options.am_weight * entry[0] + entry[1] for entry in table.values()]
            + [_NEG_INF] * (width - len(table))
            for table in self.entries
        ]
        return torch.tensor(rows, dtype=torch.float64).to(dtype=dtype, device=device), keys

    def best(
        self, options: BeamSearchOptions, dtype, device
    ) -> tuple[list, PrefixScores, int, torch.Tensor]:
        """The next beam: ``(prefixes, scores, width, source rows (B width,))`` of the best
        ``options.beam`` entries per utterance (dead rows where an utterance has fewer)."""
        total, keys = self.totals(options, dtype, device)
        values, index, width = select(total, options.beam)
        prefixes, columns, source = [], [], []
        values, index = _read(values, index)  # indices exact as floats
        for b, (idx, vals) in enumerate(zip(index, values)):
            for i, v in zip(map(int, idx), vals):
                entry = self.entries[b][keys[b][i]] if v > _NEG_INF else None
                prefixes.append(keys[b][i] if entry is not None else None)
                columns.append(entry[:4] if entry is not None else [_NEG_INF, 0.0, 0.0, 0.0])
                source.append(entry[4] if entry is not None else 0)
        scores = PrefixScores(0, dtype, device)
        scores.am, scores.fused, scores.lm, scores.ilm = (
            torch.tensor(c, dtype=dtype, device=device) for c in zip(*columns)
        )
        return prefixes, scores, width, torch.tensor(source, device=device)

    def keep(self, keys: list[list[tuple]], chosen: list[list[int]]) -> None:
        """Keep entry ``chosen[b]`` (positions in ``keys[b]``) of each utterance."""
        self.entries = [
            {keys[b][i]: table[keys[b][i]] for i in chosen[b]}
            for b, table in enumerate(self.entries)
        ]


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
) -> list[list[Hypothesis]]:
    """Beam search over an RNN-T or HAT decoder (module docstring).

    Args:
        decoder: a :class:`~cbasr.modules.decoders.TransducerDecoder`.
        h: ``(B, T, D)`` encoder states; lens: ``(B,)`` valid frames.
        options: ``max_symbols`` is required here; ``ilm_weight`` needs the HAT joint.
        lm: external LM for shallow fusion.
        per_utterance: see :class:`~cbasr.search.rows.DecoderRows` (tests only).
        monotonic: the one-label-per-frame topology (module docstring).
        masked_commit: how the prediction network steps the extended rows: every row under a
            mask (:meth:`TransducerDecoder.commit_masked`: no wait for the device to say which
            rows, the default on a GPU) or the extended rows alone (their indices read, the
            default on a CPU, where that read costs nothing and the step is several times
            smaller). The same hypotheses either way (tested).

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
    use_ilm = options.ilm_weight != 0
    if use_ilm and decoder.joint.name != "hat":
        raise ValueError(
            "ilm_weight (HAT eq. 9's lambda_2) needs the HAT joint: the RNN-T joint has no "
            "internal language model of that form"
        )
    B, T = h.shape[0], h.shape[1]
    if B == 0:
        return []
    device, dtype = h.device, torch.promote_types(h.dtype, torch.float32)
    lens = lens.to(device)
    rows = DecoderRows(decoder, decoder.begin(h, lens), B, 1, per_utterance, device)
    if masked_commit is None:
        masked_commit = h.is_cuda
    commit = decoder.commit_masked if masked_commit else decoder.commit
    width = 1
    scores = PrefixScores(B, dtype, device)
    scores.am.zero_()
    prefixes: list = [()] * B
    lm_state = lm.begin(B, device) if lm is not None else None
    for t in range(T):
        active_utt = t < lens  # (B,)
        finished = _Finished(B)
        snapshots, lm_snapshots, offset = [], [], 0
        c_scores, c_prefixes, c_width, c_lm = scores, prefixes, width, lm_state
        for s in range(options.max_symbols + 1):
            state = rows.state
            if monotonic and s == options.max_symbols:  # the emission took the frame's edge
                blank_lp = c_scores.am.new_zeros(c_scores.am.shape)
            else:
                blank_lp, label_lp = decoder.frame_scores(state, t)  # (N,), (N, V - 1)
                V1 = label_lp.shape[1]
                active = active_utt.index_select(0, utterance_rows(B, c_width, device))
                # a finished utterance stays put
                blank_lp = torch.where(active, blank_lp.to(dtype), 0.0)
                label_lp = label_lp.to(dtype).masked_fill(~active[:, None], _NEG_INF)
            snapshots.append(rows.dynamic)
            lm_snapshots.append(c_lm)
            am_blank = c_scores.am + blank_lp
            columns = _read(am_blank, c_scores.fused, c_scores.lm, c_scores.ilm)
            finished.add(c_prefixes, *columns, c_width, offset)
            offset += B * c_width
            if s == options.max_symbols:
                break
            lm_lp = c_lm["log_probs"].to(dtype) if lm is not None else None
            ilm_lp = hat_internal_lm_step(decoder, state).to(dtype) if use_ilm else None
            extend = fused_extensions(c_scores.fused, options, V1, lm_lp, ilm_lp)  # (N, V - 1)
            ext_am = c_scores.am[:, None] + label_lp  # (N, V - 1)
            d_total, d_keys = finished.totals(options, dtype, device)  # (B, M)
            M = d_total.shape[1]
            pool = torch.cat(
                [d_total, (options.am_weight * ext_am + extend).view(B, c_width * V1)], dim=1
            )
            values, index, new_width = select(pool, options.beam)
            alive = torch.isfinite(values)  # (B, W)
            kept, live = _read(index, alive)  # the one read of the candidates
            finished.keep(
                d_keys,
                [[i for i, ok in zip(idx, ok_) if ok and i < M] for idx, ok_ in zip(kept, live)],
            )
            extended = [  # (parent row, label) of each kept candidate, None: not an extension
                (b * c_width + (i - M) // V1, (i - M) % V1 + 1) if ok and i >= M else None
                for b, (idx, ok_) in enumerate(zip(kept, live))
                for i, ok in zip(idx, ok_)
            ]
            if not any(extended):
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
            parents, labels = zip(*[e or (0, 0) for e in extended])
            c_prefixes = next_prefixes(
                c_prefixes, parents, labels, [e is not None for e in extended]
            )
            rows.reorder(parent, new_width)
            rows.update(commit(rows.state, emitted, label))
            if lm is not None:
                c_lm = lm.advance(lm.reorder(c_lm, parent), emitted, label)
            c_scores, c_width = new, new_width
        # A = the best of D, each with the decoder and LM state of the sub-step it came from.
        prefixes, scores, width, source = finished.best(options, dtype, device)
        rows.replace(decoder.reorder(cat_rows(snapshots), source) if snapshots[0] else {}, width)
        if lm is not None:
            lm_state = reorder_rows(cat_rows(lm_snapshots), source)
    eos = lm_state["eos"].to(dtype) if lm is not None else None
    return finalize(
        prefixes, scores.am, scores.fused, scores.lm, scores.ilm, eos, B, width, options
    )
