"""Hypothesis rows: decoder and LM states laid out as ``K`` rows per utterance.

A beam of ``K`` hypotheses for each of ``B`` utterances is a batch of ``N = B K`` rows, row
``b K + k`` holding hypothesis ``k`` of utterance ``b``. After each search step the surviving
hypotheses' states are gathered from their parents' rows (the decoders' ``reorder``).

Decoder states mix per-hypothesis entries (the label history) with per-utterance tensors
computed once from the encoder (projections indexed by frame on dim 1). Gathering rows within
an utterance leaves the latter unchanged, so :class:`DecoderRows` keeps them aside, expanded
to ``K`` rows once, instead of copying ``(N, T, ...)`` tensors at every frame.
:data:`PER_UTTERANCE_KEYS` names them for the decoders cbasr has; a decoder not listed simply
has its whole state gathered (correct, slower). The search tests check the list by decoding
with and without it.
"""

import torch

from cbasr.modules.decoders import (
    AttentionEmissionDecoder,
    AutoregressiveDecoder,
    MonotonicAttentionDecoder,
    PointwiseDecoder,
    TransducerDecoder,
)

__all__ = ["PER_UTTERANCE_KEYS", "DecoderRows", "reorder_rows", "cat_rows", "utterance_rows"]

# State entries computed from the encoder alone in ``begin`` and never changed by ``commit``.
PER_UTTERANCE_KEYS: dict[type, tuple[str, ...]] = {
    PointwiseDecoder: ("emit_logits", "log_probs"),
    AttentionEmissionDecoder: ("emit_logits", "enc"),
    MonotonicAttentionDecoder: ("emit_logits", "keys", "values"),
    AutoregressiveDecoder: ("h", "emit_logits"),
    TransducerDecoder: ("enc", "blank_enc"),
}


def reorder_rows(state, index: torch.Tensor):
    """Rows ``index (N',)`` of a row state: tensors along dim 0, tuples (LSTM ``(h, c)``)
    along dim 1, lists by position; dicts recursively; ``None`` stays ``None``."""
    if state is None:
        return None
    if isinstance(state, dict):
        return {key: reorder_rows(value, index) for key, value in state.items()}
    if isinstance(state, tuple):
        return tuple(v.index_select(1, index) for v in state)
    if isinstance(state, list):
        return [state[i] for i in index.tolist()]
    return state.index_select(0, index)


def cat_rows(states: list):
    """Concatenate row states (same structure) along their row dimension."""
    first = states[0]
    if first is None:
        return None
    if isinstance(first, dict):
        return {key: cat_rows([s[key] for s in states]) for key in first}
    if isinstance(first, tuple):
        return tuple(torch.cat([s[i] for s in states], dim=1) for i in range(len(first)))
    if isinstance(first, list):
        return [x for s in states for x in s]
    return torch.cat(states, dim=0)


def utterance_rows(batch: int, width: int, device=None) -> torch.Tensor:
    """``(B K,)``: the utterance of each row, ``[0]*K + [1]*K + ...``."""
    return torch.arange(batch, device=device).repeat_interleave(width)


class DecoderRows:
    """A decoder's search state over ``B`` utterances with ``K`` rows each.

    Args:
        decoder: a CB or transducer decoder (``begin``/``commit``/``reorder`` API).
        state: the decoder's state from ``begin`` on the ``B`` utterances.
        batch: ``B``.
        width: rows per utterance ``K``.
        per_utterance: override :data:`PER_UTTERANCE_KEYS` (``()``: gather everything).
    """

    def __init__(
        self,
        decoder,
        state: dict,
        batch: int,
        width: int,
        per_utterance: tuple[str, ...] | None = None,
        device=None,
    ):
        if per_utterance is None:
            per_utterance = PER_UTTERANCE_KEYS.get(type(decoder), ())
        self.decoder, self.batch, self.width = decoder, batch, 1
        self.static = {k: state[k] for k in per_utterance if k in state}  # (B, ...) each
        self.dynamic = {k: v for k, v in state.items() if k not in self.static}
        self._expanded = self.static
        self.reorder(utterance_rows(batch, width, device), width)

    @classmethod
    def restore(cls, decoder, batch: int, width: int, expanded: dict, dynamic: dict):
        """Rows rebuilt from the parts a loop keeps between its steps (:attr:`expanded` and
        :attr:`dynamic`, ``width`` rows per utterance), nothing gathered: for a width that
        does not change (the per-utterance part is kept only as expanded)."""
        rows = cls.__new__(cls)
        rows.decoder, rows.batch, rows.width = decoder, batch, width
        rows.static = rows._expanded = expanded
        rows.dynamic = dynamic
        return rows

    @property
    def expanded(self) -> dict:
        """The per-utterance entries, ``width`` rows per utterance."""
        return self._expanded

    @property
    def state(self) -> dict:
        """The full decoder state of the ``B K`` rows, for ``candidates`` / ``frame_scores``."""
        return {**self.dynamic, **self._expanded}

    def update(self, state: dict) -> None:
        """Take back a state the decoder returned (or changed in place)."""
        self.dynamic = {k: v for k, v in state.items() if k not in self.static}

    def reorder(self, index: torch.Tensor, width: int) -> None:
        """Rows ``index (B width,)`` (global row numbers of the current layout), ``width`` per
        utterance, each taken from a row of its own utterance."""
        self.dynamic = self.decoder.reorder(self.dynamic, index) if self.dynamic else {}
        if width != self.width:
            rows = utterance_rows(self.batch, width, index.device)
            self._expanded = {k: v.index_select(0, rows) for k, v in self.static.items()}
            self.width = width

    def replace(self, dynamic: dict, width: int) -> None:
        """Install the per-hypothesis part of a state (``B width`` rows) built elsewhere, e.g.
        gathered from several snapshots with :func:`cat_rows` and the decoder's ``reorder``."""
        self.dynamic = dynamic
        if width != self.width:
            rows = (
                utterance_rows(self.batch, width, next(iter(self.static.values())).device)
                if self.static
                else None
            )
            self._expanded = {k: v.index_select(0, rows) for k, v in self.static.items()}
            self.width = width
