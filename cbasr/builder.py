"""Config names to classes: the one place that knows which names exist.

The builder takes typed configs: an instance of a schema dataclass of
:mod:`cbasr.config.schema` for each of the encoder, decoder and loss groups. :func:`model_configs`
makes them from a plain config (a composed one, ``config.json`` or a checkpoint's), checking each
value against its schema: an unknown name, a misspelt key or a bad choice is a ``ValueError``
naming the group and the key. Each module is constructed from its config's fields, so a default
lives in the schema alone. Whether a loss can train a decoder is each model class's
:meth:`~cbasr.models.base.AsrModel.supports`; an incompatible pair fails here, at start, naming
the losses the decoder does support.
"""

import dataclasses

from torch import nn

from cbasr.config import constructor_options, typed_by_name
from cbasr.config.schema import (
    AttentionEmissionDecoderConfig,
    AutoregressiveDecoderConfig,
    CBMarginalLossConfig,
    CBMonteCarloLossConfig,
    CBReinforceLossConfig,
    ConformerEncoderConfig,
    CTCLossConfig,
    ForcedSuffixLossConfig,
    MonotonicDecoderConfig,
    PointwiseDecoderConfig,
    RNNEncoderConfig,
    TransducerDecoderConfig,
    TransducerLossConfig,
)
from cbasr.config.upgrade import nest_label_keys
from cbasr.models import CBModel, CTCModel, TransducerModel
from cbasr.modules.decoders import (
    AttentionEmissionDecoder,
    AutoregressiveDecoder,
    MonotonicAttentionDecoder,
    PointwiseDecoder,
    TransducerDecoder,
)
from cbasr.modules.encoders import ConformerEncoder, RNNEncoder

__all__ = [
    "ENCODERS",
    "DECODERS",
    "LOSSES",
    "SCHEMAS",
    "build_model",
    "build_decoder",
    "model_configs",
    "refusal",
    "supported_losses",
]

ENCODERS = {"rnn": RNNEncoder, "conformer": ConformerEncoder}
DECODERS = {
    "pointwise": PointwiseDecoder,
    "autoregressive": AutoregressiveDecoder,
    "monotonic": MonotonicAttentionDecoder,
    "attention_emission": AttentionEmissionDecoder,
    "transducer": TransducerDecoder,
}
# Each loss name with its model class and the fixed options that select the criterion.
LOSSES = {
    "ctc": (CTCModel, {}),
    "cb_marginal": (CBModel, {"criterion": "cb_marginal"}),
    "cb_reinforce": (CBModel, {"criterion": "cb_reinforce"}),
    "cb_mc": (CBModel, {"criterion": "cb_mc"}),
    "forced_suffix": (CBModel, {"criterion": "forced_suffix"}),
    "rnnt": (TransducerModel, {"criterion": "rnnt"}),
    "hat": (TransducerModel, {"criterion": "hat"}),
    "tdt": (TransducerModel, {"criterion": "tdt"}),
}


# Each group's schema per name: what a config of that name may hold, with its defaults.
SCHEMAS = {
    "encoder": {"rnn": RNNEncoderConfig, "conformer": ConformerEncoderConfig},
    "decoder": {
        "pointwise": PointwiseDecoderConfig,
        "autoregressive": AutoregressiveDecoderConfig,
        "monotonic": MonotonicDecoderConfig,
        "attention_emission": AttentionEmissionDecoderConfig,
        "transducer": TransducerDecoderConfig,
    },
    "loss": {
        "ctc": CTCLossConfig,
        "cb_marginal": CBMarginalLossConfig,
        "cb_reinforce": CBReinforceLossConfig,
        "cb_mc": CBMonteCarloLossConfig,
        "forced_suffix": ForcedSuffixLossConfig,
        "rnnt": TransducerLossConfig,
        "hat": TransducerLossConfig,
        "tdt": TransducerLossConfig,
    },
}


def group_config(group: str, options):
    """One group's typed config: ``options`` as it is when already typed, else a plain dict
    checked against the schema its ``name`` selects (a decoder written before
    ``decoder.label`` moved to it first: :func:`cbasr.config.upgrade.nest_label_keys`)."""
    if group == "decoder" and not dataclasses.is_dataclass(options):
        options = nest_label_keys(SCHEMAS[group].get(options.get("name")), options)
    return typed_by_name(SCHEMAS[group], options, group)


def model_configs(cfg) -> tuple:
    """``(encoder, decoder, loss)`` typed configs of a training config, typed
    (:class:`~cbasr.config.schema.TrainConfig`) or plain (a checkpoint's)."""
    groups = ("encoder", "decoder", "loss")
    if dataclasses.is_dataclass(cfg):
        return tuple(group_config(group, getattr(cfg, group)) for group in groups)
    return tuple(group_config(group, cfg[group]) for group in groups)


def _loss(loss) -> tuple[type, dict]:
    """The model class of a typed loss config and its keyword arguments."""
    model_cls, fixed = LOSSES[loss.name]
    return model_cls, {**fixed, **constructor_options(loss)}


def build_decoder(decoder, input_dim: int, vocab_size: int) -> nn.Module:
    """The decoder of a typed ``decoder`` config (or a plain one) for encoder width ``input_dim``."""
    decoder = group_config("decoder", decoder)
    return DECODERS[decoder.name](
        input_dim=input_dim, vocab_size=vocab_size, **constructor_options(decoder)
    )


def refusal(loss, decoder: nn.Module) -> str | None:
    """Why the loss of config ``loss`` (its options included) cannot train ``decoder``, or None."""
    model_cls, kwargs = _loss(group_config("loss", loss))
    return model_cls.supports(decoder, **kwargs)


def supported_losses(decoder: nn.Module) -> list[str]:
    """The loss names that can train ``decoder`` (with their default options)."""
    return [name for name in LOSSES if refusal({"name": name}, decoder) is None]


def build_model(encoder, decoder, loss, input_dim: int, vocab_size: int) -> nn.Module:
    """The model for an ``encoder``/``decoder``/``loss`` config triple (typed, see
    :func:`model_configs`; a plain group is checked against its schema first).

    Args:
        input_dim: feature dimension F (source vocabulary size for a text encoder).
        vocab_size: number of target ids, blank included.

    Raises:
        ValueError: for an unknown name or option, or a decoder the loss cannot train, naming
            the losses that decoder supports.
    """
    encoder = group_config("encoder", encoder)
    decoder = group_config("decoder", decoder)
    loss = group_config("loss", loss)
    model_cls, loss_kwargs = _loss(loss)
    enc = ENCODERS[encoder.name](input_dim=input_dim, **constructor_options(encoder))
    dec = build_decoder(decoder, enc.output_dim, vocab_size)
    reason = model_cls.supports(dec, **loss_kwargs)
    if reason:
        raise ValueError(
            f"loss {loss.name!r} cannot train decoder {decoder.name!r} "
            f"({_describe(decoder)}): {reason}. This decoder trains with losses "
            f"{supported_losses(dec)}"
        )
    return model_cls(enc, dec, **loss_kwargs)


def _describe(decoder) -> str:
    """The decoder's options that differ from its schema's defaults (``label.hidden=...`` for
    a nested group's)."""
    defaults, options = _flat_options(type(decoder)()), _flat_options(decoder)
    changed = {k: v for k, v in options.items() if v != defaults[k]}
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "default options"


def _flat_options(config, prefix: str = "") -> dict:
    """:func:`constructor_options` with a nested group's options as ``<group>.<key>``."""
    flat = {}
    for key, value in constructor_options(config).items():
        if dataclasses.is_dataclass(value):
            flat.update(_flat_options(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat
