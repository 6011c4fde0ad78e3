"""cbasr: end-to-end speech recognition with Conditional Bernoulli, CTC, RNN-T and HAT models.

Docstrings cite the "CB paper" (Sean Robertson 2020, "The Conditional Bernoulli and its
Application to Speech Recognition") and the "HAT paper" (Ehsan Variani, David Rybach, Cyril
Allauzen, Michael Riley 2020, "Hybrid Autoregressive Transducer (HAT)", arXiv:2003.07705) by
equation number; docs/references.md lists every reference in full.
"""

__version__ = "0.1.0"

__all__ = ["Recognizer", "Transcription"]


def __getattr__(name: str):
    """``cbasr.Recognizer`` and ``cbasr.Transcription``, imported on first use so that
    ``import cbasr`` stays light."""
    if name in __all__:
        from cbasr.inference import recognizer

        return getattr(recognizer, name)
    raise AttributeError(f"module 'cbasr' has no attribute {name!r}")
