"""Typed configuration schemas (dataclasses) registered in Hydra's ConfigStore, and the preset
tree that composes them.

``CONF_DIR`` is the package's ``conf/`` directory (``cbasr/conf``, shipped as package data, so a
plain ``pip install .`` carries it; the repository's top-level ``conf`` is a link to it): the
Hydra config tree of ``cbasr-train``, ``cbasr-train-lm`` and ``cbasr-models``, with one
directory per config group (``encoder/``, ``decoder/``, ``loss/``, ...).
"""

import dataclasses
import enum
from pathlib import Path
from typing import TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

__all__ = [
    "CONF_DIR",
    "to_plain",
    "to_typed",
    "plain",
    "typed",
    "typed_by_name",
    "constructor_options",
]

Schema = TypeVar("Schema")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def to_plain(cfg: DictConfig) -> dict:
    """A composed config as plain containers: interpolations resolved, a missing value an error,
    each choice (``Enum``) as its string value."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)


def to_typed(cfg: DictConfig):
    """A composed config as its schema's dataclass, every group typed (``TrainConfig`` with an
    ``RNNEncoderConfig``, ...): interpolations resolved, a missing value an error."""
    return OmegaConf.to_object(cfg)


def plain(config) -> dict:
    """A typed config (a schema dataclass, its groups typed or plain) as plain containers,
    choices as strings: what ``config.json`` and checkpoints keep."""
    return OmegaConf.to_container(OmegaConf.structured(config), enum_to_str=True)


def typed(schema: type[Schema], values: dict, group: str) -> Schema:
    """A plain config group (composed, or read back from ``config.json`` or a checkpoint) as an
    instance of its ``schema`` dataclass: every value checked against the schema's types and
    choices, an entry the schema lacks an error, an entry an older config lacks the schema's
    default. A bad entry is a ``ValueError`` naming it as ``<group>.<key>`` (``group`` empty: a
    whole config, whose keys carry their group)."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except (ValidationError, ConfigKeyError) as e:
        key = f"{group}.{e.full_key}" if group else e.full_key
        raise ValueError(f"{key}: {str(e.msg).splitlines()[0]}") from None


def typed_by_name(schemas: dict[str, type], options, group: str, what: str | None = None):
    """A config group whose ``name`` picks its schema, typed: ``options`` as it is when already
    a dataclass instance, else checked by :func:`typed` against ``schemas[options["name"]]``.
    An unknown name is a ``ValueError`` listing the choices (``what``: the word for them,
    default ``group``)."""
    if dataclasses.is_dataclass(options):
        return options
    name = options.get("name")
    if name not in schemas:
        raise ValueError(f"unknown {what or group} {name!r}; choose one of {sorted(schemas)}")
    return typed(schemas[name], options, group)


def constructor_options(config) -> dict:
    """A typed config's fields but its ``name``, as constructor keywords (choices as strings)."""
    return {
        f.name: (value.value if isinstance(value, enum.Enum) else value)
        for f in dataclasses.fields(config)
        if f.name != "name"
        for value in [getattr(config, f.name)]
    }
