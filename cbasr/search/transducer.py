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

import dataclasses
import math

import torch

from cbasr.models.transducer_greedy import capture, static_runs
from cbasr.modules.decoders import TransducerDecoder
from cbasr.search.fusion import LabelScorer
from cbasr.search.hypotheses import MERGES, BeamSearchOptions, Hypothesis
from cbasr.search.prefix import (
    PrefixScores,
    finalize,
    fused_extensions,
    next_prefixes,
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
        # one tensor from lists, not element by element (recipes/synth/RESULTS.md,
        # "Measurements behind defaults")
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
        values, index, width = select(total, options.beam, stable=True)
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


class _HostPrefixes:
    """The prefixes as tuples on the host, ``D`` a dict per utterance (:class:`_Finished`):
    each sub-step reads its candidates' scores and the kept indices (two reads), each frame
    the next beam (one read), and the search stops a frame's sub-steps when no extension is
    kept. The beam starts one row wide and grows to ``beam`` (any width with ``beam=None``).
    """

    width = 1

    def __init__(self, batch: int, options: BeamSearchOptions, dtype, device):
        self.batch, self.options, self.dtype, self.device = batch, options, dtype, device
        self.prefixes: list = [()] * batch

    def start_scores(self) -> PrefixScores:
        scores = PrefixScores(self.batch, self.dtype, self.device)
        scores.am.zero_()
        return scores

    def frame(self, t: int) -> None:
        self.finished, self.current = _Finished(self.batch), self.prefixes

    def add(self, am_blank: torch.Tensor, scores: PrefixScores, width: int, offset: int) -> None:
        columns = _read(am_blank, scores.fused, scores.lm, scores.ilm)
        self.finished.add(self.current, *columns, width, offset)

    def totals(self) -> torch.Tensor:
        total, self.keys = self.finished.totals(self.options, self.dtype, self.device)
        return total

    def keep(self, index: torch.Tensor, alive: torch.Tensor, M: int, width: int, V1: int) -> bool:
        """Keep the chosen entries of ``D``; whether any extension was chosen."""
        kept, live = _read(index, alive)  # the one read of the candidates
        self.finished.keep(
            self.keys,
            [[i for i, ok in zip(idx, ok_) if ok and i < M] for idx, ok_ in zip(kept, live)],
        )
        self.extended = [  # (parent row, label) of each kept candidate, None: not an extension
            (b * width + (i - M) // V1, (i - M) % V1 + 1) if ok and i >= M else None
            for b, (idx, ok_) in enumerate(zip(kept, live))
            for i, ok in zip(idx, ok_)
        ]
        return any(self.extended)

    def extend(self, parent: torch.Tensor, label: torch.Tensor, emitted: torch.Tensor) -> None:
        parents, labels = zip(*[e or (0, 0) for e in self.extended])
        self.current = next_prefixes(
            self.current, parents, labels, [e is not None for e in self.extended]
        )

    def best(self) -> tuple[PrefixScores, int, torch.Tensor]:
        self.prefixes, scores, width, source = self.finished.best(
            self.options, self.dtype, self.device
        )
        return scores, width, source

    def final(self, frames: int) -> list:
        return self.prefixes


# splitmix64's constants (Steele et al. 2014), as signed 64-bit integers
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 ``x`` (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def extend_hash(prefix_hash: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """The 64-bit hash of each prefix extended by ``label`` (int64, wrapping arithmetic):
    splitmix64's finaliser, a bijection of 64-bit words, of the prefix's hash plus the label
    times the golden ratio; the empty prefix hashes to 0."""
    z = prefix_hash + (label.long() + 1) * _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


class _DevicePrefixes:
    """The prefixes on the device: the same search as :class:`_HostPrefixes`, with no read of
    the device until the last frame.

    - The beam and each sub-step's candidates are ``beam`` rows per utterance from the first
      frame (dead rows at ``-inf``). ``D`` is ``2 beam`` slots per utterance (at most ``beam``
      kept from the last sub-step, ``beam`` added) and a spill slot where what is not kept is
      written; a slot holds ``(am, fused, lm, ilm)`` in float64 (the host's Python floats)
      and ``(hash, length, source row, valid)``, two tensors gathered and scattered whole.
    - A prefix is known by a 64-bit hash of its labels (:func:`extend_hash`) and its length:
      two candidates of an utterance with equal hash and length are one prefix, whose
      probabilities add. Two different prefixes would be merged only if their hashes
      collided, at odds of about 2^-64 a pair.
    - ``D`` keeps the host's order: its entries in the order first reached, those kept by a
      sub-step in the order chosen (with :func:`select`'s stable ranking, ties go alike).
    - The labels are not kept per row: each sub-step records its candidates' parent rows and
      labels, each frame the snapshot row of each kept hypothesis, and the final prefixes are
      traced back through these once, after the last frame (one read).
    - Every frame runs all its sub-steps (the host stops when no extension is kept; the later
      sub-steps keep ``D`` as it is), so no flag is read either.
    """

    def __init__(self, batch: int, options: BeamSearchOptions, dtype, device):
        self.batch, self.options, self.dtype, self.device = batch, options, dtype, device
        self.width = W = options.beam
        self.rows = batch * W
        self.hash = torch.zeros(self.rows, dtype=torch.long, device=device)
        self.length = torch.zeros(self.rows, dtype=torch.long, device=device)
        self.buffer: torch.Tensor | None = None  # (T, 1 + 2 sub-steps, N): see final()
        self.empty_real = torch.tensor([_NEG_INF, 0.0, 0.0, 0.0], device=device).double()
        self.empty_real = self.empty_real.expand(batch, 2 * W + 1, 4)
        self.empty_int = torch.zeros(batch, 2 * W + 1, 4, dtype=torch.long, device=device)
        self.positions = torch.arange(W, device=device)
        self.row_ids = torch.arange(self.rows, device=device)  # built once, not per sub-step
        self.ones = torch.ones(self.rows, dtype=torch.long, device=device)

    def start_scores(self) -> PrefixScores:
        scores = PrefixScores(self.rows, self.dtype, self.device)
        scores.am.view(self.batch, self.width)[:, 0] = 0.0
        return scores

    def frame(self, t: torch.Tensor) -> None:
        self.t = t
        self.real, self.int = self.empty_real.clone(), self.empty_int.clone()
        self.c_hash, self.c_length, self.steps = self.hash, self.length, []

    def add(self, am_blank: torch.Tensor, scores: PrefixScores, width: int, offset: int) -> None:
        B, W, spill = self.batch, self.width, 2 * self.width
        source = offset + self.row_ids
        new_real = torch.stack([am_blank, scores.fused, scores.lm, scores.ilm], 1).double()
        new_int = torch.stack([self.c_hash, self.c_length, source, self.ones], 1)
        new_real, new_int = new_real.view(B, W, 4), new_int.view(B, W, 4)
        hash_, length, _, valid = self.int.unbind(2)
        same = (  # (B, W, 2 W + 1): candidate r's prefix is entry m's
            (valid[:, None, :] == 1)
            & (hash_[:, None, :] == new_int[:, :, None, 0])
            & (length[:, None, :] == new_int[:, :, None, 1])
        )
        am = new_real[..., 0]
        live = am > _NEG_INF
        merged = live & same.any(2)
        added = live & ~merged
        position = valid.sum(1, keepdim=True) + added.cumsum(1) - 1
        target = torch.where(merged, same.int().argmax(2), torch.where(added, position, spill))
        target = target[..., None].expand(B, W, 4)
        # another alignment of a prefix in D: the same state, probabilities add (host: _log_add)
        old_real, old_int = self.real.gather(1, target), self.int.gather(1, target)
        high, low = torch.maximum(old_real[..., 0], am), torch.minimum(old_real[..., 0], am)
        old_real[..., 0] = high + torch.log1p(torch.exp(low - high))
        merged = merged[..., None]
        self.real.scatter_(1, target, torch.where(merged, old_real, new_real))
        self.int.scatter_(1, target, torch.where(merged, old_int, new_int))
        self.real[:, spill] = self.empty_real[:, spill]
        self.int[:, spill] = 0

    def totals(self) -> torch.Tensor:
        total = self.options.am_weight * self.real[:, :-1, 0] + self.real[:, :-1, 1]
        return total.to(self.dtype)

    def keep(self, index: torch.Tensor, alive: torch.Tensor, M: int, width: int, V1: int) -> bool:
        """``D``'s chosen entries, in the order chosen, to the front; always True (no read)."""
        B, W = self.batch, self.width
        chosen = alive & (index < M)
        order = torch.where(chosen, self.positions, W + self.positions).argsort(1)
        slot = torch.where(chosen, index, M).gather(1, order)  # M: the spill slot, empty
        slot = slot[..., None].expand(B, W, 4)
        self.real = torch.cat([self.real.gather(1, slot), self.empty_real[:, W:]], 1)
        self.int = torch.cat([self.int.gather(1, slot), self.empty_int[:, W:]], 1)
        return True

    def extend(self, parent: torch.Tensor, label: torch.Tensor, emitted: torch.Tensor) -> None:
        self.c_hash = torch.where(emitted, extend_hash(self.c_hash[parent], label), 0)
        self.c_length = self.c_length[parent] + 1
        self.steps += [parent, torch.where(emitted, label, 0)]

    def best(self) -> tuple[PrefixScores, int, torch.Tensor]:
        B, W = self.batch, self.width
        values, index, _ = select(self.totals(), W, stable=True)
        alive = torch.isfinite(values).view(-1, 1)
        index = index[..., None].expand(B, W, 4)
        real = torch.where(alive, self.real.gather(1, index).view(-1, 4), self.empty_real[0, 0])
        ints = self.int.gather(1, index).view(-1, 4)
        self.hash, self.length, source, _ = ints.unbind(1)
        source = torch.where(alive[:, 0], source, 0)
        scores = PrefixScores(0, self.dtype, self.device)
        scores.am, scores.fused, scores.lm, scores.ilm = real.to(self.dtype).unbind(1)
        self.buffer.index_copy_(0, self.t.view(1), torch.stack([source, *self.steps])[None])
        return scores, W, source

    def final(self, frames: int) -> list:
        """The beam's prefixes, traced back from the records of the first ``frames`` frames
        (one read of the device)."""
        N = self.rows
        records = self.buffer[:frames].cpu()  # (T, 1 + 2 S, N)
        T, S = records.shape[0], (records.shape[1] - 1) // 2
        labels = torch.zeros(N, T, S, dtype=torch.long)
        row = torch.arange(N)
        for t in reversed(range(T)):
            source = records[t, 0, row]  # sub-step s, row r of that frame's candidates
            step, row = source // N, source % N
            for s in range(S, 0, -1):  # back through the sub-steps' extensions
                here = step == s
                labels[:, t, s - 1] = torch.where(here, records[t, 2 * s, row], 0)
                row = torch.where(here, records[t, 2 * s - 1, row], row)
                step = torch.where(here, s - 1, step)
        return [tuple(v for v in y if v) for y in labels.view(N, T * S).tolist()]


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
        frames: _Frames,
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


def _graphed(frames: _Frames, h: torch.Tensor, lens: torch.Tensor, per_utterance):
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
    if merge == "graphs" and h.device.type != "cuda" and CAPTURE:
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
            static = _StaticSearch(frames, h, lens, per_utterance, graphs=False)
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
