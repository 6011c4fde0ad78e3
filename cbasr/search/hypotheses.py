"""What every search takes and returns: its options and its hypotheses.

Scores follow one convention in every family. A hypothesis ``y`` carries

- ``am_score``: the log of the model's probability mass collected for ``y`` (the sum over the
  alignments the search kept; with an unbounded beam, the exact ``log P(y | x)`` where the
  family allows it, see each search);
- ``lm_score``: ``log P_LM(y)`` of the external language model, end of sentence included (0
  without one);
- ``ilm_score``: HAT's internal LM score ``log P_ILM(y)`` (HAT paper eq. 8; 0 otherwise);

and is ranked by the fused score (shallow fusion; HAT paper eq. 9 for HAT)::

    score = am_weight * am_score + lm_weight * lm_score - ilm_weight * ilm_score + label_bonus * |y|

divided by ``max(|y|, 1)`` at the end when ``length_norm`` is set (pruning during the search
uses the unnormalised score).
"""

from dataclasses import asdict, dataclass, field

__all__ = ["BeamSearchOptions", "Hypothesis", "CB_SEARCHES", "MERGES"]

CB_SEARCHES = ("auto", "frame", "label")
MERGES = ("host", "device", "graphs")


@dataclass(frozen=True)
class BeamSearchOptions:
    """Options shared by the beam searches.

    Attributes:
        beam: hypotheses kept per utterance; ``None`` keeps every hypothesis with a finite
            score (exhaustive: for tiny inputs and tests only, the count grows exponentially).
        nbest: hypotheses returned per utterance (``None``: the whole final beam).
        am_weight: ``lambda_1`` of HAT eq. (9): weight of the model's log probability.
        lm_weight: shallow-fusion weight of the external LM (``lambda``; 1 in HAT eq. 9).
        ilm_weight: ``lambda_2`` of HAT eq. (9): weight of the subtracted internal LM (HAT only).
        label_bonus: added per emitted label (counters the deletions an LM favours).
        length_norm: rank final hypotheses by score per label.
        max_symbols: transducers: most labels emitted on one frame (``None``: the model's own
            ``max_symbols``).
        cb_search: CB models: ``"frame"`` (the time-synchronous prefix search), ``"label"``
            (the label-synchronous search, autoregressive decoders only) or ``"auto"``
            (frame, see :func:`cbasr.search.cb_search_kind`).
        merge: RNN-T and HAT: where the beam search keeps and merges its prefixes (the same
            hypotheses in each): ``"host"`` (reads the device a few times a frame),
            ``"device"`` (once a batch) or ``"graphs"`` (the device, each frame replayed from
            a CUDA graph: CUDA only); see :func:`cbasr.search.transducer_beam_search`.
    """

    beam: int | None = 4
    nbest: int | None = 1
    am_weight: float = 1.0
    lm_weight: float = 0.0
    ilm_weight: float = 0.0
    label_bonus: float = 0.0
    length_norm: bool = False
    max_symbols: int | None = None
    cb_search: str = "auto"
    merge: str = "host"

    def __post_init__(self):
        if self.beam is not None and self.beam < 1:
            raise ValueError(
                f"beam must be >= 1 (or None for an exhaustive search), got {self.beam}"
            )
        if self.nbest is not None and self.nbest < 1:
            raise ValueError(f"nbest must be >= 1 (or None for the whole beam), got {self.nbest}")
        if self.max_symbols is not None and self.max_symbols < 1:
            raise ValueError(f"max_symbols must be >= 1, got {self.max_symbols}")
        if self.cb_search not in CB_SEARCHES:
            raise ValueError(
                f"cb_search must be one of {', '.join(CB_SEARCHES)}, got {self.cb_search!r}"
            )
        if self.merge not in MERGES:
            raise ValueError(f"merge must be one of {', '.join(MERGES)}, got {self.merge!r}")
        if self.merge != "host" and self.beam is None:
            raise ValueError(f"merge={self.merge!r} needs a beam width (beam=None: merge='host')")
        if self.am_weight <= 0:
            raise ValueError(f"am_weight (lambda_1) must be positive, got {self.am_weight}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Hypothesis:
    """One label sequence found by a search (ids ``1 .. V-1``; see the module docstring)."""

    tokens: list[int]
    score: float
    am_score: float
    lm_score: float = 0.0
    ilm_score: float = 0.0
    extra: dict = field(default_factory=dict)
