"""The synthetic speech corpora: eSpeak NG speech with gold phone or word alignments.

Sentences from a small English grammar (:mod:`.text`) are spoken by synthetic speakers
(:mod:`.speakers`: an eSpeak voice and variant with a rate and pitch) through eSpeak NG
driven by ``ctypes`` (:mod:`.espeak`); phone labels and start times come from eSpeak's
phoneme events (:mod:`.phones` documents the inventory and its merge map), and
:mod:`.corpus` writes audio, manifests and inventories (:func:`make_corpus`).

The connected-digits corpus (:mod:`.digits`, :func:`make_digits_corpus`) has the same
speakers say digit strings one word at a time, joined with gaps, in reverberation and noise
(:mod:`.acoustics`), with gold word times. Both write their directory through
:mod:`.directory`.
"""

from cbasr.corpora.synth.corpus import SIZES, CorpusConfig, CorpusSummary, make_corpus, plan_corpus
from cbasr.corpora.synth.digits import DIGIT_WORDS, DIGITS_SIZES, DigitsConfig, make_digits_corpus
from cbasr.corpora.synth.phones import FULL_PHONES, MERGE_MAP, MERGED_PHONES, UnknownPhoneError

__all__ = [
    "DIGITS_SIZES",
    "DIGIT_WORDS",
    "FULL_PHONES",
    "MERGED_PHONES",
    "MERGE_MAP",
    "SIZES",
    "CorpusConfig",
    "CorpusSummary",
    "DigitsConfig",
    "UnknownPhoneError",
    "make_corpus",
    "make_digits_corpus",
    "plan_corpus",
]
