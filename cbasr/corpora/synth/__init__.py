"""The synthetic speech corpus ``synth``: eSpeak NG speech with gold phone alignments.

Sentences from a small English grammar (:mod:`.text`) are spoken by synthetic speakers
(:mod:`.speakers`: an eSpeak voice and variant with a rate and pitch) through eSpeak NG
driven by ``ctypes`` (:mod:`.espeak`); phone labels and start times come from eSpeak's
phoneme events (:mod:`.phones` documents the inventory and its merge map), and
:mod:`.corpus` writes audio, manifests and inventories (:func:`make_corpus`).
"""

from cbasr.corpora.synth.corpus import SIZES, CorpusConfig, CorpusSummary, make_corpus, plan_corpus
from cbasr.corpora.synth.phones import FULL_PHONES, MERGE_MAP, MERGED_PHONES, UnknownPhoneError

__all__ = [
    "FULL_PHONES",
    "MERGED_PHONES",
    "MERGE_MAP",
    "SIZES",
    "CorpusConfig",
    "CorpusSummary",
    "UnknownPhoneError",
    "make_corpus",
    "plan_corpus",
]
