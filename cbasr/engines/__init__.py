"""Engines: training, checkpointing, decoding and scoring."""
