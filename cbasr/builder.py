"""Config names to classes: the one place that knows which names exist.

The builder takes plain dicts (a config group's contents), pops ``name`` and passes the
remaining keys as keyword arguments, so modules never see a config object.
"""

from torch import nn

from cbasr.modules.asr import CTCModel
from cbasr.modules.decoders import PointwiseDecoder
from cbasr.modules.encoders import RNNEncoder

__all__ = ["ENCODERS", "DECODERS", "MODELS", "build_model"]

ENCODERS = {"rnn": RNNEncoder}
DECODERS = {"pointwise": PointwiseDecoder}
# Each loss with the model class that trains and decodes with it, and the decoders it supports.
MODELS = {"ctc": (CTCModel, ("pointwise",))}


def _pick(table: dict, group: str, options: dict):
    options = dict(options)
    name = options.pop("name")
    if name not in table:
        raise ValueError(f"unknown {group} {name!r}; choose one of {sorted(table)}")
    return table[name], options


def build_model(encoder: dict, decoder: dict, loss: dict, input_dim: int, vocab_size: int) -> nn.Module:
    """The model for an ``encoder``/``decoder``/``loss`` config triple.

    Args:
        input_dim: feature dimension F.
        vocab_size: number of target ids, blank included.

    Raises:
        ValueError: for an unknown name, or a decoder the loss cannot train, naming the
            decoders that loss supports.
    """
    encoder_cls, encoder_kwargs = _pick(ENCODERS, "encoder", encoder)
    decoder_cls, decoder_kwargs = _pick(DECODERS, "decoder", decoder)
    (model_cls, decoders), loss_kwargs = _pick(MODELS, "loss", loss)
    if decoder["name"] not in decoders:
        raise ValueError(f"loss {loss['name']!r} cannot train decoder {decoder['name']!r}; "
                         f"it supports decoders {list(decoders)}")
    enc = encoder_cls(input_dim=input_dim, **encoder_kwargs)
    dec = decoder_cls(input_dim=enc.output_dim, vocab_size=vocab_size, **decoder_kwargs)
    return model_cls(enc, dec, **loss_kwargs)
