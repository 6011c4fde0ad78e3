"""Typed configuration schemas (dataclasses) registered in Hydra's ConfigStore, and the preset
tree that composes them.

``CONF_DIR`` is the package's ``conf/`` directory (``cbasr/conf``, shipped as package data, so a
plain ``pip install .`` carries it; the repository's top-level ``conf`` is a link to it): the
Hydra config tree of ``cbasr-train``, ``cbasr-train-lm`` and ``cbasr-models``, with one
directory per config group (``encoder/``, ``decoder/``, ``loss/``, ...).
"""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

__all__ = ["CONF_DIR", "to_plain"]

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def to_plain(cfg: DictConfig) -> dict:
    """A composed config as plain containers: interpolations resolved, a missing value an error,
    each choice (``Enum``) as its string value."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)
