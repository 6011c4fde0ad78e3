"""cbasr: end-to-end speech recognition with Conditional Bernoulli, CTC, RNN-T and HAT models."""

__version__ = "0.1.0"
