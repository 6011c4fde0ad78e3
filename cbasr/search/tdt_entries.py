"""The TDT beam search's hypotheses as tensors (:mod:`cbasr.search.tdt`).

A set of hypotheses in ``N`` groups (an utterance's, or an utterance's on one frame) is an
:class:`Entries`: ``K`` slots per group, each slot the fields :data:`FIELDS`, stored together
as one ``(N, K, 7)`` int64 tensor (so selecting, gathering and copying slots is one tensor
operation, not one per field):

- ``am``: float64 (its bits in column 0), the log of the path mass collected (``-inf``: no
  hypothesis in the slot);
- ``hash``, ``length``: the label prefix, known by a 64-bit hash of its labels
  (:func:`cbasr.search._prefix_tables.extend_hash`) and its length;
- ``frame``: the frame the hypothesis waits on (its last edge's landing frame);
- ``node``: the prefix's node in the search's prefix tree (:class:`Nodes`), which spells it;
- ``row``: the id of its prediction-network state in :class:`States`;
- ``label``: a label extension whose prediction-network state is still to be computed (its
  parent's state is at ``row``: the network steps only the hypotheses expanded), or 0.

Two hypotheses of a group with equal ``(hash, length, frame)`` are one lattice node, their
masses summed (:func:`merge`); two different nodes would be merged only if a 64-bit key of
the three collided, at odds of about 2^-64 a pair.
"""

import torch

from cbasr.search._prefix_tables import GOLDEN
from cbasr.search.hypotheses import BeamSearchOptions
from cbasr.search.prefix import select
from cbasr.search.rows import reorder_rows

__all__ = [
    "FIELDS",
    "Entries",
    "empty",
    "cat",
    "take",
    "merge",
    "score",
    "best",
    "put_rows",
    "States",
    "Waiting",
    "Finished",
    "Nodes",
]

FIELDS = ("am", "hash", "length", "frame", "node", "row", "label")
_NEG_INF = float("-inf")
_COLUMN = {field: i for i, field in enumerate(FIELDS)}
_LAST_KEY = torch.iinfo(torch.int64).max  # merge(): empty slots sort after every live one
_EMPTY_AM = torch.tensor(_NEG_INF, dtype=torch.float64).view(torch.int64).item()


class Entries:
    """Hypotheses in ``N`` groups of ``K`` slots: ``x (N, K, len(FIELDS))`` int64, one column
    per field; ``e[field]`` is that field's ``(N, K)`` view (float64 for ``am``)."""

    __slots__ = ("x", "_columns")

    def __init__(self, x: torch.Tensor):
        self.x, self._columns = x, {}

    @staticmethod
    def of(**fields) -> "Entries":
        """Slots from every field's ``(N, K)`` tensor."""
        am = fields["am"].to(torch.float64).view(torch.int64)
        return Entries(torch.stack([am] + [fields[f] for f in FIELDS[1:]], dim=-1))

    def __getitem__(self, field: str) -> torch.Tensor:
        column = self._columns.get(field)  # each field's view made once
        if column is None:
            column = self.x[..., _COLUMN[field]]
            if field == "am":
                column = column.view(torch.float64)
            self._columns[field] = column
        return column

    def __setitem__(self, field: str, value) -> None:
        column = self[field]
        if isinstance(value, torch.Tensor):
            column.copy_(value)
        else:
            column.fill_(value)

    @property
    def shape(self) -> torch.Size:
        return self.x.shape[:2]

    def replace(self, **fields) -> "Entries":
        """A copy with the fields given replaced (tensors broadcast to ``(N, K)``)."""
        out = Entries(self.x.clone())
        for field, value in fields.items():
            out[field] = value
        return out

    def view(self, *shape: int) -> "Entries":
        return Entries(self.x.view(*shape, len(FIELDS)))


def empty(groups: int, width: int, device) -> Entries:
    """``width`` empty slots per group."""
    x = torch.zeros(groups, width, len(FIELDS), dtype=torch.long, device=device)
    x[..., 0] = _EMPTY_AM
    return Entries(x)


def cat(a: Entries, b: Entries) -> Entries:
    """The slots of ``a`` then those of ``b``, per group."""
    return Entries(torch.cat([a.x, b.x], dim=1))


def take(e: Entries, groups: torch.Tensor) -> Entries:
    """Groups ``groups (N',)`` of ``e``."""
    return Entries(e.x.index_select(0, groups))


def merge(e: Entries) -> Entries:
    """Each lattice node once per group: the first slot of equal ``(hash, length, frame)``
    holds the summed mass of them all, the others are emptied. Each group's live keys are
    sorted (stably, the empty slots last), so equal ones are neighbours and the first of a run
    is the lowest slot of its node."""
    N, K = e.shape
    live = e["am"] > _NEG_INF
    # (hash, length, frame) as one key: frames below 2^24; the mixed prefix hash makes a
    # collision of two different triples as unlikely as one of two hashes
    key = e["hash"] ^ (((e["length"] << 24) | e["frame"]) * GOLDEN)
    key, order = torch.where(live, key, _LAST_KEY).sort(dim=1, stable=True)
    live_sorted = live.gather(1, order)
    starts = torch.ones_like(live_sorted)  # a slot that begins a run of one node
    starts[:, 1:] = (key[:, 1:] != key[:, :-1]) | ~live_sorted[:, 1:] | ~live_sorted[:, :-1]
    slots = torch.arange(K, device=key.device)
    start = torch.where(starts, slots, 0).cummax(dim=1).values  # the run's first position
    lead = torch.empty_like(order).scatter_(1, order, order.gather(1, start))  # slot -> lead
    am = e["am"]  # -inf in every empty slot
    top = torch.full_like(am, _NEG_INF).scatter_reduce(1, lead, am, "amax")
    mass = torch.where(live, (am - top.gather(1, lead)).exp(), 0.0)
    total = top + torch.zeros_like(am).scatter_add(1, lead, mass).log()
    return e.replace(am=torch.where(live & (lead == slots), total, _NEG_INF))


def score(e: Entries, options: BeamSearchOptions) -> torch.Tensor:
    """The ranking score ``am_weight * am + label_bonus * |y|`` (``-inf``: empty)."""
    if options.label_bonus == 0 and options.am_weight == 1:
        return e["am"]
    return options.am_weight * e["am"] + options.label_bonus * e["length"]


def best(e: Entries, beam: int | None, options: BeamSearchOptions) -> Entries:
    """The ``beam`` best hypotheses of each group by :func:`score` (``None``: every one),
    best first; a group with fewer fills up with empty slots."""
    _, index, _ = select(score(e, options), beam)
    return Entries(e.x.gather(1, index.unsqueeze(2).expand(-1, -1, len(FIELDS))))


def put_rows(state, index: torch.Tensor, rows):
    """``state`` with its rows ``index (N,)`` replaced by those of ``rows`` (in place): tensors
    along dim 0, tuples (LSTM ``(h, c)``) along dim 1, dicts recursively, as
    :func:`~cbasr.search.rows.reorder_rows` reads them."""
    for (x, dim), (r, _) in zip(_tensors(state), _tensors(rows)):
        x.index_copy_(dim, index, r)
    return state


def _leaves(state, fn):
    """``state`` with ``fn(tensor, row_dim)`` applied to each tensor: tensors have their rows
    along dim 0, tuples (LSTM ``(h, c)``) along dim 1, dicts recursively, by sorted key (so two
    states of one structure list their tensors alike)."""
    if state is None:
        return None
    if isinstance(state, dict):
        return {key: _leaves(state[key], fn) for key in sorted(state)}
    if isinstance(state, tuple):
        return tuple(fn(x, 1) for x in state)
    return fn(state, 0)


def _tensors(state) -> list[tuple[torch.Tensor, int]]:
    """``state``'s tensors and their row dims, in :func:`_leaves`' order."""
    found = []
    _leaves(state, lambda x, dim: found.append((x, dim)))
    return found


def _rows(state) -> int:
    tensors = _tensors(state)
    return tensors[0][0].shape[tensors[0][1]] if tensors else 0


class States:
    """The prediction-network states hypotheses point at: each visited frame's rows (its
    ``C_0``, ``C_1``... in turn), kept for as long as a hypothesis may still wait on one
    (``horizon`` frames); row ``r`` of frame ``f``'s has the id ``(f + 1) 2^32 + r`` (frame -1:
    the start). They live in one buffer per state tensor, a ring of ``horizon + 1`` frames of
    ``capacity`` rows (grown as a frame needs), so reading any rows is one ``index_select``
    per tensor."""

    def __init__(self, start, horizon: int):
        self.slots, self.capacity = horizon + 1, _rows(start)
        self.buffer = _leaves(start, self._allocate(self.capacity))
        self.add(-1, [start])

    def _allocate(self, capacity: int):
        def make(x, dim):
            shape = list(x.shape)
            shape[dim] = self.slots * capacity
            return x.new_zeros(shape)

        return make

    @staticmethod
    def ids(t: int, rows: torch.Tensor) -> torch.Tensor:
        return rows + ((t + 1) << 32)

    def _grow(self, capacity: int) -> None:
        def grow(old, dim):
            shape = list(old.shape)
            shape[dim : dim + 1] = [self.slots, capacity]
            new = old.new_zeros(shape)
            new.narrow(dim + 1, 0, self.capacity).copy_(old.unflatten(dim, (self.slots, -1)))
            return new.flatten(dim, dim + 1)

        self.buffer = _leaves(self.buffer, grow)
        self.capacity = capacity

    def add(self, t: int, snapshots: list) -> None:
        """Frame ``t``'s rows: those of ``snapshots`` (row states) in turn."""
        total = sum(map(_rows, snapshots))
        if total > self.capacity:
            self._grow(max(total, 2 * self.capacity))
        offset = ((t + 1) % self.slots) * self.capacity
        buffers = _tensors(self.buffer)
        for state in snapshots:
            n = _rows(state)
            for (buffer, dim), (x, _) in zip(buffers, _tensors(state)):
                buffer.narrow(dim, offset, n).copy_(x)
            offset += n

    def read(self, ids: torch.Tensor, live: torch.Tensor):
        """The states of ids ``ids (N,)`` where ``live``, anything elsewhere."""
        slot = ((ids >> 32) % self.slots) * self.capacity + (ids & 0xFFFFFFFF)
        return reorder_rows(self.buffer, torch.where(live, slot, 0))


class Waiting:
    """The hypotheses waiting on later frames: per utterance a ring of ``R`` buckets (frame
    ``f`` in bucket ``f mod R``; ``R`` is the longest duration plus one, so the frames a
    search lands on from frame ``t`` have buckets of their own), bucket ``b R + r`` a group
    of the table, which keeps the ``capacity`` best (``None``: every one) of the hypotheses
    that reached its frame."""

    def __init__(self, start: dict, ring: int, capacity: int | None, options: BeamSearchOptions):
        B = start["am"].shape[0]
        self.batch, self.ring, self.capacity, self.options = B, ring, capacity, options
        self.e = empty(B * ring, 1, start.x.device)
        first = torch.arange(B, device=start.x.device) * ring  # each utterance's frame 0
        self.e.x.index_copy_(0, first, start.x)

    def pop(self, t: int) -> tuple[torch.Tensor, Entries] | None:
        """``(utterances (U,), their hypotheses on frame t (U, Q))``, taken out of the table;
        None where no hypothesis waits on ``t``."""
        buckets = torch.arange(self.batch, device=self.e.x.device) * self.ring
        buckets = buckets + t % self.ring
        live = self.e["am"].index_select(0, buckets) > _NEG_INF
        utts = live.any(dim=1).nonzero().squeeze(1)
        if not utts.numel():
            return None
        mine = buckets.index_select(0, utts)
        e = take(self.e, mine)
        self.e.x[..., 0].index_fill_(0, mine, _EMPTY_AM)
        return utts, e

    def push(self, utts: torch.Tensor, frames: torch.Tensor, e: Entries) -> None:
        """Hypotheses ``e (U J, M)`` of utterances ``utts`` into the buckets of frames
        ``frames (J,)``, group ``u J + j`` landing on ``frames[j]``, merged with those there."""
        if not bool((e["am"] > _NEG_INF).any()):
            return
        buckets = (utts.unsqueeze(1) * self.ring + frames % self.ring).flatten()  # (U J,)
        kept = best(merge(cat(take(self.e, buckets), e)), self.capacity, self.options)
        Q, W = self.e.shape[1], kept.shape[1]
        if W > Q:
            self.e = cat(self.e, empty(self.e.shape[0], W - Q, buckets.device))
        elif W < Q:
            kept = cat(kept, empty(len(buckets), Q - W, buckets.device))
        self.e.x.index_copy_(0, buckets, kept.x)


class Finished:
    """The hypotheses that reached their utterance's last frame, merged by prefix, the best
    ``beam`` (all with ``beam=None``) of each utterance kept."""

    def __init__(self, batch: int, options: BeamSearchOptions, device):
        self.e, self.options = empty(batch, 1, device), options

    def add(self, utts: torch.Tensor, e: Entries) -> None:
        if not bool((e["am"] > _NEG_INF).any()):
            return
        e = e.replace(frame=0)  # one node per prefix
        kept = best(merge(cat(take(self.e, utts), e)), self.options.beam, self.options)
        B, F = self.e.shape
        W = kept.shape[1]
        if W > F:
            self.e = cat(self.e, empty(B, W - F, utts.device))
        elif W < F:
            kept = cat(kept, empty(len(utts), F - W, utts.device))
        self.e.x.index_copy_(0, utts, kept.x)


class Nodes:
    """The prefix tree: node 0 the empty prefix, each other a parent node and a label."""

    def __init__(self, device):
        self.parents = [torch.full((1,), -1, dtype=torch.long, device=device)]
        self.labels = [torch.zeros(1, dtype=torch.long, device=device)]
        self.count = 1

    def add(self, parents: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """New nodes, each ``labels[i]`` after node ``parents[i]``: their ids."""
        ids = torch.arange(self.count, self.count + parents.numel(), device=parents.device)
        self.parents.append(parents)
        self.labels.append(labels)
        self.count += parents.numel()
        return ids

    def spell(self, nodes: list[int]) -> list[tuple]:
        """The label prefix of each node."""
        parents, labels = torch.cat(self.parents).tolist(), torch.cat(self.labels).tolist()
        out = []
        for node in nodes:
            prefix = []
            while node > 0:
                prefix.append(labels[node])
                node = parents[node]
            out.append(tuple(reversed(prefix)))
        return out
