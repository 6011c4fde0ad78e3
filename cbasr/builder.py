"""Config names to classes: the one place that knows which names exist.

The builder takes plain dicts (a config group's contents), pops ``name`` and passes the
remaining keys as keyword arguments, so modules never see a config object. Whether a loss can
train a decoder is each model class's :meth:`~cbasr.models.base.AsrModel.supports`; an
incompatible pair fails here, at start, naming the losses the decoder does support.
"""

from torch import nn

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
    "build_model",
    "build_decoder",
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
}


def _pick(table: dict, group: str, options: dict):
    options = dict(options)
    name = options.pop("name")
    if name not in table:
        raise ValueError(f"unknown {group} {name!r}; choose one of {sorted(table)}")
    return table[name], options


def build_decoder(decoder: dict, input_dim: int, vocab_size: int) -> nn.Module:
    """The decoder of a ``decoder`` config for encoder width ``input_dim``."""
    decoder_cls, kwargs = _pick(DECODERS, "decoder", decoder)
    return decoder_cls(input_dim=input_dim, vocab_size=vocab_size, **kwargs)


def refusal(loss: dict, decoder: nn.Module) -> str | None:
    """Why the loss of config ``loss`` (its options included) cannot train ``decoder``, or None."""
    (model_cls, fixed), loss_kwargs = _pick(LOSSES, "loss", loss)
    return model_cls.supports(decoder, **fixed, **loss_kwargs)


def supported_losses(decoder: nn.Module) -> list[str]:
    """The loss names that can train ``decoder`` (with their default options)."""
    return [name for name in LOSSES if refusal({"name": name}, decoder) is None]


def build_model(
    encoder: dict, decoder: dict, loss: dict, input_dim: int, vocab_size: int
) -> nn.Module:
    """The model for an ``encoder``/``decoder``/``loss`` config triple.

    Args:
        input_dim: feature dimension F (source vocabulary size for a text encoder).
        vocab_size: number of target ids, blank included.

    Raises:
        ValueError: for an unknown name, or a decoder the loss cannot train, naming the
            losses that decoder supports.
    """
    encoder_cls, encoder_kwargs = _pick(ENCODERS, "encoder", encoder)
    (model_cls, fixed), loss_kwargs = _pick(LOSSES, "loss", loss)
    enc = encoder_cls(input_dim=input_dim, **encoder_kwargs)
    dec = build_decoder(decoder, enc.output_dim, vocab_size)
    reason = refusal(loss, dec)
    if reason:
        raise ValueError(
            f"loss {loss['name']!r} cannot train decoder {decoder['name']!r} "
            f"({_describe(decoder)}): {reason}. This decoder trains with losses "
            f"{supported_losses(dec)}"
        )
    return model_cls(enc, dec, **fixed, **loss_kwargs)


def _describe(options: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items() if k != "name") or "default options"
