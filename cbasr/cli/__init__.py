"""Command-line entry points. Only these import Hydra."""
