"""Storage: atomic file writes, checkpoints, and the fault injection the kill tests use.

The lowest layer beside ``cbasr.checks``: it imports nothing else from the package, so every
layer above (the LM, training, inference and evaluation, the command-line tools) shares one way to write a file.
"""
