"""Typed configuration schemas (dataclasses) registered in Hydra's ConfigStore, and the preset
tree that composes them.

``CONF_DIR`` is the package's ``conf/`` directory (``cbasr/conf``, shipped as package data, so a
plain ``pip install .`` carries it; the repository's top-level ``conf`` is a link to it): the
Hydra config tree of ``cbasr-train``, ``cbasr-train-lm`` and ``cbasr-models``, with one
directory per config group (``encoder/``, ``decoder/``, ``loss/``, ...).
"""

from pathlib import Path

__all__ = ["CONF_DIR"]

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
