"""External language models as the searches see them: next-label scores for rows of prefixes.

Shallow fusion adds ``lm_weight * log P_LM(y)`` to a hypothesis's score (for HAT, eq. 9 of the
HAT paper with the internal LM subtracted; see :mod:`cbasr.search.hypotheses`). A search keeps
one LM state per hypothesis row next to the decoder's; a :class:`LabelScorer` gives, for each
row, ``log P_LM(v | prefix)`` for the labels ``v = 1 .. V-1`` of the recogniser's vocabulary
and ``log P_LM(</s> | prefix)``, added when the utterance ends.

- :class:`NeuralLMScorer`: the toolkit's :class:`~cbasr.modules.language_model.LSTMLanguageModel`
  (``cbasr-train-lm``).
- :class:`ArpaLMScorer`: an ARPA back-off n-gram (:mod:`cbasr.lm.arpa`) over the labels.
- :class:`WordArpaScorer`: an ARPA word n-gram for character or piece recognisers, scored at
  word ends.

Both map the recogniser's tokens to the LM's by their strings, so the two vocabularies may be
ordered differently; a token the LM cannot score is an error when it is loaded (an ARPA file
with ``<unk>`` scores unknown tokens as ``<unk>``).
"""

import abc
import functools
from pathlib import Path

import torch

from cbasr.data.vocab import SENTENCEPIECE
from cbasr.lm.arpa import ArpaModel, read_arpa
from cbasr.lm.neural import load_lm_checkpoint
from cbasr.modules.language_model import BOUNDARY, LSTMLanguageModel
from cbasr.search.rows import reorder_rows
from cbasr.storage.checkpoint import checkpoint_of

__all__ = [
    "LabelScorer",
    "NeuralLMScorer",
    "ArpaLMScorer",
    "WordArpaScorer",
    "load_language_model",
]


class LabelScorer(abc.ABC):
    """A language model over the recogniser's labels ``1 .. V-1``, one state per row.

    States are dicts holding at least ``"log_probs"`` ``(N, V - 1)`` (the next label; entry
    ``i`` for id ``i + 1``) and ``"eos"`` ``(N,)`` (the end of sentence), float32.
    """

    name: str = "lm"

    @abc.abstractmethod
    def begin(self, rows: int, device: torch.device | None = None) -> dict:
        """The state of ``rows`` empty prefixes (after ``<s>``)."""

    @abc.abstractmethod
    def advance(self, state: dict, emitted: torch.Tensor, labels: torch.Tensor) -> dict:
        """Extend the rows with ``emitted (N,)`` True by ``labels (N,)`` (ids); others unchanged."""

    def advance_masked(self, state: dict, emitted: torch.Tensor, labels: torch.Tensor) -> dict:
        """:meth:`advance` with no read of ``emitted`` on the host where the LM allows it
        (``labels`` a valid id in every row): a neural LM steps every row and keeps the new
        state where ``emitted``; this default, for LMs whose states live on the host, is
        :meth:`advance`."""
        return self.advance(state, emitted, labels)

    def reorder(self, state: dict, index: torch.Tensor) -> dict:
        """Rows ``index (N',)`` of ``state``."""
        return reorder_rows(state, index)

    @abc.abstractmethod
    def sequence_log_prob(self, labels: list[int]) -> float:
        """``log P_LM(y)`` of a whole label sequence, ``</s>`` included, computed without the
        row states (an independent path through the model, for checks and rescoring)."""


def _vocab_map(
    tokens: list[str], lm_index: dict[str, int], source: str, unknown: int | None = None
) -> list[int]:
    """LM ids of the recogniser's tokens ``1 .. V-1``."""
    ids = []
    for token in tokens[1:]:
        if token in lm_index:
            ids.append(lm_index[token])
        elif unknown is not None:
            ids.append(unknown)
        else:
            raise ValueError(
                f"token {token!r} of the recogniser's vocabulary is not in the vocabulary of the "
                f"language model {source}"
            )
    return ids


class NeuralLMScorer(LabelScorer):
    """An :class:`LSTMLanguageModel` for fusion.

    Args:
        model: the LM (put in eval mode).
        lm_tokens: its vocabulary (id 0 the boundary).
        tokens: the recogniser's vocabulary (id 0 the blank).
        source: a name for messages (the checkpoint path).
    """

    def __init__(
        self,
        model: LSTMLanguageModel,
        lm_tokens: list[str],
        tokens: list[str],
        source: str = "<lstm>",
    ):
        self.model = model.eval()
        self.name = source
        device = next(model.parameters()).device
        lm_index = {t: i for i, t in enumerate(lm_tokens) if i != BOUNDARY}
        # (V,)
        self.ids = torch.tensor([BOUNDARY] + _vocab_map(tokens, lm_index, source), device=device)

    def _split(self, log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LM log probabilities ``(N, V_lm)`` -> ``(labels (N, V - 1), eos (N,))``."""
        return log_probs.index_select(1, self.ids[1:]), log_probs[:, BOUNDARY]

    @torch.no_grad()
    def begin(self, rows, device=None):
        start = torch.full((rows,), BOUNDARY, dtype=torch.long, device=self.ids.device)
        log_probs, lstm = self.model.step(start)
        labels, eos = self._split(log_probs)
        return {"lstm": lstm, "log_probs": labels, "eos": eos}

    @torch.no_grad()
    def advance(self, state, emitted, labels):
        rows = emitted.nonzero().flatten()
        if rows.numel() == 0:
            return state
        h, c = state["lstm"]
        log_probs, (h_new, c_new) = self.model.step(
            self.ids[labels.index_select(0, rows)],
            (h.index_select(1, rows), c.index_select(1, rows)),
        )
        new_labels, new_eos = self._split(log_probs)
        h, c = h.index_copy(1, rows, h_new), c.index_copy(1, rows, c_new)
        return {
            "lstm": (h, c),
            "log_probs": state["log_probs"].index_copy(0, rows, new_labels),
            "eos": state["eos"].index_copy(0, rows, new_eos),
        }

    @torch.no_grad()
    def advance_masked(self, state, emitted, labels):
        h, c = state["lstm"]
        log_probs, (h_new, c_new) = self.model.step(self.ids[labels], (h, c))
        new_labels, new_eos = self._split(log_probs)
        keep = emitted[:, None]
        return {
            "lstm": (torch.where(keep, h_new, h), torch.where(keep, c_new, c)),
            "log_probs": torch.where(keep, new_labels, state["log_probs"]),
            "eos": torch.where(emitted, new_eos, state["eos"]),
        }

    @torch.no_grad()
    def sequence_log_prob(self, labels):
        targets = (
            self.ids[torch.tensor([labels], dtype=torch.long, device=self.ids.device)]
            if labels
            else torch.zeros(1, 0, dtype=torch.long, device=self.ids.device)
        )
        lens = torch.tensor([len(labels)], device=self.ids.device)
        return float(self.model.sequence_log_probs(targets, lens)[0])


class ArpaLMScorer(LabelScorer):
    """An ARPA n-gram for fusion: each row's state is its last ``order - 1`` words.

    Args:
        arpa: the model.
        tokens: the recogniser's vocabulary (id 0 the blank).
    """

    def __init__(self, arpa: ArpaModel, tokens: list[str]):
        self.arpa, self.name = arpa, arpa.source
        unknown = arpa.index.get("<unk>")
        self.words = _vocab_map(tokens, arpa.index, arpa.source, unknown)  # arpa id of label i + 1
        self.columns = self.words + [arpa.index["</s>"]]
        self.start = (arpa.index["<s>"],)
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    def _row(self, history: tuple[int, ...]) -> torch.Tensor:
        """``(V,)``: the labels' log probabilities after ``history``, then the end of sentence."""
        row = self._rows.get(history)
        if row is None:
            row = torch.from_numpy(self.arpa.distribution(history)[self.columns]).float()
            self._rows[history] = row
        return row

    def _state(self, histories: list[tuple[int, ...]], device) -> dict:
        rows = torch.stack([self._row(h) for h in histories]).to(device)  # (N, V)
        return {"history": histories, "log_probs": rows[:, :-1], "eos": rows[:, -1]}

    def begin(self, rows, device=None):
        return self._state([self.start] * rows, device)

    def advance(self, state, emitted, labels):
        if not bool(emitted.any()):
            return state
        keep = self.arpa.order - 1
        histories = list(state["history"])
        for row in emitted.nonzero().flatten().tolist():
            extended = histories[row] + (self.words[int(labels[row]) - 1],)
            histories[row] = extended[max(0, len(extended) - keep) :] if keep > 0 else ()
        return self._state(histories, state["log_probs"].device)

    def sequence_log_prob(self, labels):
        return self.arpa.sentence_log_prob([self.arpa.words[self.words[v - 1]] for v in labels])


class WordArpaScorer(LabelScorer):
    """A word ARPA n-gram for a recogniser of characters or sentencepiece pieces: the LM scores
    each word when it ends (end-of-word scoring, no look-ahead).

    A row's state is its last ``order - 1`` words and the word it is spelling. A label that
    ends that word carries ``ln P(word | history)``: for characters the separator ``|``, for
    pieces any piece that starts a word (``\u2581...``), which also starts the next one;
    every other label scores 0. The end of sentence carries the open word's score and
    ``ln P(</s> | ...)``. The sum over a label sequence is the ARPA's sentence log probability
    of the words it spells (:meth:`sequence_log_prob`). Words outside the ARPA's vocabulary
    score as ``<unk>`` when it has one, else ``unk_log_prob``. A separator with no word open
    (a leading or repeated ``|``) scores 0.

    Since a word's whole LM score arrives at its last label, the search sees no LM evidence
    while a word is being spelled; a beam wide enough to carry a word's spellings to its end
    (and the label bonus for the insertions it invites) is the price of scoring words exactly.

    Args:
        arpa: the word model.
        tokens: the recogniser's vocabulary (id 0 the blank).
        units: ``"chars"`` or ``"sp:<model>"``: how labels spell words.
        unk_log_prob: ``ln P`` of a word the ARPA lacks when it has no ``<unk>``.
        cache_size: the ``(history, open word)`` scores kept for reuse, least recently used out
            (the search asks for the same rows again and again; a corpus would fill any
            unbounded cache).
    """

    def __init__(
        self,
        arpa: ArpaModel,
        tokens: list[str],
        units: str,
        unk_log_prob: float = -23.0,
        cache_size: int = 200_000,
    ):
        if units != "chars" and not units.startswith(SENTENCEPIECE):
            raise ValueError(
                f"word-level fusion needs character or sentencepiece units, not {units!r}"
            )
        self.arpa, self.name = arpa, arpa.source
        self.pieces = units != "chars"
        labels = tokens[1:]
        if self.pieces:
            self.ends = torch.tensor([t.startswith("\u2581") for t in labels])
            self.spelling = [t.removeprefix("\u2581") for t in labels]
        else:
            self.ends = torch.tensor([t == "|" for t in labels])
            self.spelling = labels
        self.is_end = self.ends.tolist()
        self.unknown = next((arpa.index[u] for u in ("<unk>", "<UNK>") if u in arpa.index), None)
        self.unk_log_prob = unk_log_prob
        self.start = (arpa.index["<s>"],)
        self._scores_of = functools.lru_cache(maxsize=cache_size)(self._score_open_word)

    def _word(self, word: str, history: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
        """``ln P(word | history)`` and the history after it."""
        index = self.arpa.index.get(word, self.unknown)
        if index is None:
            return self.unk_log_prob, ()  # an n-gram model knows nothing after an unknown word
        keep = self.arpa.order - 1
        extended = history + (index,)
        return self.arpa.log_prob(index, history), extended[
            max(0, len(extended) - keep) :
        ] if keep else ()

    def _score_open_word(self, history: tuple[int, ...], partial: str) -> tuple[float, float]:
        """``(score of ending the open word, score of ending the sentence)``; cached as
        ``_scores_of``."""
        end, after = self._word(partial, history) if partial else (0.0, history)
        return end, end + self.arpa.log_prob(self.arpa.index["</s>"], after)

    def _state(self, histories, partials, device) -> dict:
        # (N, 2)
        scores = torch.tensor(
            [self._scores_of(h, p) for h, p in zip(histories, partials)], dtype=torch.float32
        )
        log_probs = scores[:, :1] * self.ends.float()  # (N, V - 1): only word ends score
        return {
            "history": histories,
            "partial": partials,
            "log_probs": log_probs.to(device),
            "eos": scores[:, 1].to(device),
        }

    def begin(self, rows, device=None):
        return self._state([self.start] * rows, [""] * rows, device)

    def _step(self, history, partial, label: int) -> tuple[tuple[int, ...], str]:
        i = label - 1
        if not self.is_end[i]:
            return history, partial + self.spelling[i]
        if partial:
            _, history = self._word(partial, history)
        return history, self.spelling[i] if self.pieces else ""

    def advance(self, state, emitted, labels):
        if not bool(emitted.any()):
            return state
        histories, partials = list(state["history"]), list(state["partial"])
        for row in emitted.nonzero().flatten().tolist():
            histories[row], partials[row] = self._step(
                histories[row], partials[row], int(labels[row])
            )
        return self._state(histories, partials, state["log_probs"].device)

    def sequence_log_prob(self, labels):
        """The ARPA's ``ln P(<s> words </s>)`` of the words ``labels`` spell, computed from the
        words (not the row states), ``<unk>`` (or ``unk_log_prob``) for unknown ones."""
        if self.pieces:  # a word-initial piece is a space, then its spelling
            text = "".join(
                (" " if self.is_end[v - 1] else "") + self.spelling[v - 1] for v in labels
            )
        else:  # the separator is a space
            text = "".join(" " if self.is_end[v - 1] else self.spelling[v - 1] for v in labels)
        history, total = self.start, 0.0
        for word in text.split():
            score, history = self._word(word, history)
            total += score
        return total + self.arpa.log_prob(self.arpa.index["</s>"], history)


def load_language_model(
    path: str | Path,
    tokens: list[str],
    device: str | torch.device = "cpu",
    words: bool = False,
    units: str | None = None,
) -> LabelScorer:
    """A :class:`LabelScorer` from ``path``: an LM experiment directory of ``cbasr-train-lm``
    (its ``checkpoints/best.pt``), a ``.pt`` checkpoint of one, or an ARPA file (``.gz`` too).

    Args:
        tokens: the recogniser's vocabulary, id 0 the blank.
        words: the ARPA file is a word model for a recogniser of characters or pieces
            (:class:`WordArpaScorer`; ``units`` says which).
        units: the recogniser's units (``exp.units``), for ``words``.
    """
    path = checkpoint_of(path, "--lm", ": has this language model been trained (cbasr-train-lm)?")
    if path.suffix == ".pt":
        if words:
            raise ValueError(f"{path}: word-level fusion takes an ARPA word model, not a .pt")
        model, lm_tokens = load_lm_checkpoint(path, device)
        return NeuralLMScorer(model, lm_tokens, tokens, source=str(path))
    if words:
        return WordArpaScorer(read_arpa(path), tokens, units or "")
    return ArpaLMScorer(read_arpa(path), tokens)
