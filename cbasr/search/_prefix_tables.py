"""Where the transducer beam search (:mod:`cbasr.search.transducer`) keeps and merges its
prefixes: on the host (:class:`_HostPrefixes`, tuples and dicts; the finished hypotheses,
:class:`_Finished`) or on the device (:class:`_DevicePrefixes`, each prefix a 64-bit hash
:func:`extend_hash` and its length, one read of the device a batch); the two give the same
hypotheses (``tests/search/test_transducer.py``)."""

import math

import torch

from cbasr.search.hypotheses import BeamSearchOptions
from cbasr.search.prefix import PrefixScores, next_prefixes, select

__all__ = ["extend_hash"]

_NEG_INF = float("-inf")


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
GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 ``x`` (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def extend_hash(prefix_hash: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """The 64-bit hash of each prefix extended by ``label`` (int64, wrapping arithmetic):
    splitmix64's finaliser, a bijection of 64-bit words, of the prefix's hash plus the label
    times the golden ratio; the empty prefix hashes to 0."""
    z = prefix_hash + (label.long() + 1) * GOLDEN
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
