"""Inference: a trained experiment loaded (:mod:`~cbasr.inference.experiment`), decoding of
splits, forced alignment, export (TorchScript, ONNX) and the recogniser of audio files. Imports
nothing from :mod:`cbasr.training`."""
