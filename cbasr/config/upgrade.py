"""Plain configs written before a change of the schema, moved to today's keys before they are
typed: a checkpoint and ``config.json`` keep the config of the version that wrote them, and
every experiment read back (decoding, alignment, export, the recogniser, a resumed run's
check) has its model groups typed by :func:`cbasr.builder.model_configs`, whose
:func:`~cbasr.builder.group_config` calls this.

- ``decoder.label``: the label-history network's ``embed_dim``, ``hidden``, ``num_layers``
  and ``context`` were keys of the decoder group itself (``decoder.hidden``).
- :data:`REMOVED_KEYS`: options since removed, read away where their value cannot change what
  the run computes from here (:func:`drop_removed_keys`).
"""

import dataclasses
import logging

from omegaconf import OmegaConf

from cbasr.config.schema import LabelContextConfig

__all__ = ["LABEL_KEYS", "REMOVED_KEYS", "drop_removed_keys", "nest_label_keys", "today_s_keys"]

log = logging.getLogger(__name__)

LABEL_KEYS = tuple(f.name for f in dataclasses.fields(LabelContextConfig))

_ANY = object()
# "group.key" -> the one value that may be dropped (_ANY: every value): emit_bias_init set only
# a new run's initial bias, max_long_gap_share only refused to start; weight_noise_start other
# than 0 would start the noise at another step, so such a config is refused, not changed.
REMOVED_KEYS = {
    "trainer.emit_bias_init": _ANY,
    "trainer.max_long_gap_share": _ANY,
    "optim.weight_noise_start": 0,
}


def drop_removed_keys(cfg: dict) -> dict:
    """``cfg`` (a plain whole config, changed in place) without the :data:`REMOVED_KEYS` it
    holds, with one log line naming them; a ``ValueError`` naming a key whose value the
    schema's behaviour today cannot reproduce."""
    dropped = []
    for dotted, droppable in REMOVED_KEYS.items():
        group, key = dotted.split(".")
        options = cfg.get(group)
        if not isinstance(options, dict) or key not in options:
            continue
        if droppable is not _ANY and options[key] != droppable:
            raise ValueError(
                f"{dotted} = {options[key]!r}: the option was removed and only "
                f"{droppable!r} reads as today's behaviour; use a new exp_dir"
            )
        del options[key]
        dropped.append(dotted)
    if dropped:
        log.info("a config written before %s was removed: read without it", ", ".join(dropped))
    return cfg


def today_s_keys(cfg) -> dict:
    """A plain whole config (a dict or a ``DictConfig``: from Python, or an old
    ``config.json``) as a new dict, ready to be typed: :func:`drop_removed_keys` applied."""
    return drop_removed_keys(OmegaConf.to_container(OmegaConf.create(cfg)))


def nest_label_keys(schema: type | None, options):
    """A plain decoder group of ``schema`` (None: an unknown name) with the label-history keys
    of an older config (:data:`LABEL_KEYS` at its top level) moved into ``label``, as a new
    dict, with one log line naming them; a group that has none, or whose schema has no
    ``label``, as it is. A key given both ways is a ``ValueError`` naming both."""
    if schema is None or "label" not in {f.name for f in dataclasses.fields(schema)}:
        return options
    flat = [key for key in LABEL_KEYS if key in options]
    if not flat:
        return options
    label = dict(options.get("label") or {})
    both = [key for key in flat if key in label]
    if both:
        raise ValueError(
            f"decoder.{both[0]} and decoder.label.{both[0]} are both given: "
            f"decoder.label.{both[0]} is today's key"
        )
    label.update((key, options[key]) for key in flat)
    log.info(
        "decoder: a config written before decoder.label; %s read as %s",
        ", ".join(f"decoder.{key}" for key in flat),
        ", ".join(f"decoder.label.{key}" for key in flat),
    )
    return {**{k: v for k, v in options.items() if k not in flat}, "label": label}
