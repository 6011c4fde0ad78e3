"""The TDT beam search's hypotheses as tensors (:mod:`cbasr.search.tdt`).

A set of hypotheses in ``N`` groups (an utterance's, or an utterance's on one frame) is a
dict of ``(N, K)`` tensors, :data:`FIELDS`, ``K`` slots per group:

- ``am``: float64, the log of the path mass collected (``-inf``: no hypothesis in the slot);
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

from cbasr.search._prefix_tables import extend_hash
from cbasr.search.hypotheses import BeamSearchOptions
from cbasr.search.prefix import select
from cbasr.search.rows import cat_rows, reorder_rows

__all__ = [
    "FIELDS",
    "PAIRWISE",
    "empty",
    "cat",
    "take",
    "merge",
    "score",
    "best",
    "put_rows",
    "where_rows",
    "States",
    "Waiting",
    "Finished",
    "Nodes",
]

FIELDS = ("am", "hash", "length", "frame", "node", "row", "label")
PAIRWISE = 64  # merge() compares every pair of slots up to this many per group, else sorts
_NEG_INF = float("-inf")


def empty(groups: int, width: int, device) -> dict:
    """``width`` empty slots per group."""
    e = {k: torch.zeros(groups, width, dtype=torch.long, device=device) for k in FIELDS}
    e["am"] = torch.full((groups, width), _NEG_INF, dtype=torch.float64, device=device)
    return e


def cat(a: dict, b: dict) -> dict:
    """The slots of ``a`` then those of ``b``, per group."""
    return {k: torch.cat([a[k], b[k]], dim=1) for k in FIELDS}


def take(e: dict, groups: torch.Tensor) -> dict:
    """Groups ``groups (N',)`` of ``e``."""
    return {k: v.index_select(0, groups) for k, v in e.items()}


def merge(e: dict) -> dict:
    """Each lattice node once per group: the first slot of equal ``(hash, length, frame)``
    holds the summed mass of them all, the others are emptied. Up to :data:`PAIRWISE` slots
    per group every pair is compared; more (an exhaustive search's), the live slots are
    grouped by sorting their keys (``torch.unique``)."""
    N, K = e["am"].shape
    live = e["am"] > _NEG_INF
    key = extend_hash(e["hash"], (e["length"] << 24) | e["frame"])  # frames below 2^24
    if K <= PAIRWISE:
        same = live.unsqueeze(2) & (key.unsqueeze(1) == key.unsqueeze(2))  # [n, i, j]
        lead = (same & live.unsqueeze(1)).to(torch.int8).argmax(dim=2)  # i's first equal j
    else:
        group = torch.arange(N, device=key.device).unsqueeze(1).expand(N, K)
        _, index = torch.unique(extend_hash(key, group), return_inverse=True)
        index = index.flatten()
        slots = torch.arange(N * K, device=key.device)
        first = torch.full_like(slots, N * K).scatter_reduce(  # each key's first live slot
            0, index, torch.where(live.flatten(), slots, N * K), "amin"
        )
        lead = (first[index] % K).view(N, K)  # (in the group's own row: the key holds it)
    am = e["am"].masked_fill(~live, _NEG_INF)
    top = torch.full_like(am, _NEG_INF).scatter_reduce(1, lead, am, "amax")
    mass = torch.where(live, (am - top.gather(1, lead)).exp(), 0.0)
    total = top + torch.zeros_like(am).scatter_add(1, lead, mass).log()
    slots = torch.arange(K, device=key.device)
    return {**e, "am": torch.where(live & (lead == slots), total, _NEG_INF)}


def score(e: dict, options: BeamSearchOptions) -> torch.Tensor:
    """The ranking score ``am_weight * am + label_bonus * |y|`` (``-inf``: empty)."""
    return options.am_weight * e["am"] + options.label_bonus * e["length"]


def best(e: dict, beam: int | None, options: BeamSearchOptions) -> dict:
    """The ``beam`` best hypotheses of each group by :func:`score` (``None``: every one),
    best first; a group with fewer fills up with empty slots."""
    _, index, _ = select(score(e, options), beam)
    return {k: v.gather(1, index) for k, v in e.items()}


def put_rows(state, index: torch.Tensor, rows):
    """``state`` with its rows ``index (N,)`` replaced by those of ``rows`` (in place): tensors
    along dim 0, tuples (LSTM ``(h, c)``) along dim 1, dicts recursively, as
    :func:`~cbasr.search.rows.reorder_rows` reads them."""
    if state is None:
        return None
    if isinstance(state, dict):
        return {key: put_rows(value, index, rows[key]) for key, value in state.items()}
    if isinstance(state, tuple):
        return tuple(s.index_copy_(1, index, r) for s, r in zip(state, rows))
    return state.index_copy_(0, index, rows)


def where_rows(mask: torch.Tensor, a, b):
    """Row by row, ``a`` where ``mask (N,)`` holds, else ``b`` (row states of one structure)."""
    if a is None:
        return None
    if isinstance(a, dict):
        return {key: where_rows(mask, a[key], b[key]) for key in a}
    if isinstance(a, tuple):
        return tuple(torch.where(mask.view(1, -1, 1), x, y) for x, y in zip(a, b))
    return torch.where(mask.view(-1, *[1] * (a.dim() - 1)), a, b)


class States:
    """The prediction-network states hypotheses point at: each visited frame's rows (its
    ``C_0``, ``C_1``... concatenated), kept for as long as a hypothesis may still wait on
    one (``horizon`` frames); row ``r`` of frame ``f``'s has the id ``(f + 1) 2^32 + r``
    (frame -1: the start)."""

    def __init__(self, start, horizon: int):
        self.frames, self.horizon = {-1: start}, horizon

    @staticmethod
    def ids(t: int, rows: torch.Tensor) -> torch.Tensor:
        return rows + ((t + 1) << 32)

    def add(self, t: int, state) -> None:
        self.frames[t] = state
        for f in [f for f in self.frames if f < t - self.horizon]:
            del self.frames[f]

    def read(self, ids: torch.Tensor, live: torch.Tensor):
        """The states of ids ``ids (N,)`` where ``live``, anything elsewhere."""
        frame, row = (ids >> 32) - 1, ids & 0xFFFFFFFF
        frames = frame[live].unique().tolist() or [max(self.frames)]
        out = None
        for f in frames:
            here = live & (frame == f)
            rows = reorder_rows(self.frames[f], torch.where(here, row, 0))
            out = rows if out is None else where_rows(here, rows, out)
        return out


class Waiting:
    """The hypotheses waiting on later frames: per utterance a ring of ``R`` buckets (frame
    ``f`` in bucket ``f mod R``; ``R`` is the longest duration plus one, so the frames a
    search lands on from frame ``t`` have buckets of their own), bucket ``b R + r`` a group
    of the table, which keeps the ``capacity`` best (``None``: every one) of the hypotheses
    that reached its frame."""

    def __init__(self, start: dict, ring: int, capacity: int | None, options: BeamSearchOptions):
        B = start["am"].shape[0]
        self.batch, self.ring, self.capacity, self.options = B, ring, capacity, options
        self.e = empty(B * ring, 1, start["am"].device)
        first = torch.arange(B, device=start["am"].device) * ring  # each utterance's frame 0
        for k in FIELDS:
            self.e[k].index_copy_(0, first, start[k])

    def pop(self, t: int) -> tuple[torch.Tensor, dict] | None:
        """``(utterances (U,), their hypotheses on frame t (U, Q))``, taken out of the table;
        None where no hypothesis waits on ``t``."""
        buckets = torch.arange(self.batch, device=self.e["am"].device) * self.ring
        buckets = buckets + t % self.ring
        live = self.e["am"].index_select(0, buckets) > _NEG_INF
        utts = live.any(dim=1).nonzero().squeeze(1)
        if not utts.numel():
            return None
        mine = buckets.index_select(0, utts)
        e = take(self.e, mine)
        self.e["am"].index_fill_(0, mine, _NEG_INF)
        return utts, e

    def push(self, utts: torch.Tensor, frames: torch.Tensor, e: dict) -> None:
        """Hypotheses ``e (U J, M)`` of utterances ``utts`` into the buckets of frames
        ``frames (J,)``, group ``u J + j`` landing on ``frames[j]``, merged with those there."""
        if not bool((e["am"] > _NEG_INF).any()):
            return
        buckets = (utts.unsqueeze(1) * self.ring + frames % self.ring).flatten()  # (U J,)
        kept = best(merge(cat(take(self.e, buckets), e)), self.capacity, self.options)
        Q, W = self.e["am"].shape[1], kept["am"].shape[1]
        if W > Q:
            self.e = cat(self.e, empty(self.e["am"].shape[0], W - Q, buckets.device))
        elif W < Q:
            kept = cat(kept, empty(len(buckets), Q - W, buckets.device))
        for k in FIELDS:
            self.e[k].index_copy_(0, buckets, kept[k])


class Finished:
    """The hypotheses that reached their utterance's last frame, merged by prefix, the best
    ``beam`` (all with ``beam=None``) of each utterance kept."""

    def __init__(self, batch: int, options: BeamSearchOptions, device):
        self.e, self.options = empty(batch, 1, device), options

    def add(self, utts: torch.Tensor, e: dict) -> None:
        if not bool((e["am"] > _NEG_INF).any()):
            return
        e = {**e, "frame": torch.zeros_like(e["frame"])}  # one node per prefix
        kept = best(merge(cat(take(self.e, utts), e)), self.options.beam, self.options)
        B, F = self.e["am"].shape
        W = kept["am"].shape[1]
        if W > F:
            self.e = cat(self.e, empty(B, W - F, utts.device))
        elif W < F:
            kept = cat(kept, empty(len(utts), F - W, utts.device))
        for k in FIELDS:
            self.e[k].index_copy_(0, utts, kept[k])


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


def gather_states(snapshots: list):
    """The row states ``snapshots`` as one, their rows in turn."""
    return cat_rows(snapshots) if len(snapshots) > 1 else snapshots[0]
