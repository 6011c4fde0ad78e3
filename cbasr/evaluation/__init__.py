"""Evaluation: error rates with intervals and per-speaker counts, repeat deletions, ROUGE, and
comparison tables across systems, from decoding directories. Imports no torch."""
