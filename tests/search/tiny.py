"""Tiny random models of every family for the search tests, built like cbasr-train builds them.

Random CB models emit rarely and random HAT models mostly emit blanks; :func:`build` shifts the
emission (or blank) bias so that searches face real choices between staying and emitting.
"""

import torch

from cbasr import builder
from cbasr.models import CBModel
from cbasr.modules.decoders import TransducerDecoder

ENCODER = {"name": "rnn", "hidden": 8, "num_layers": 1, "stack": 2, "stride": 2, "dropout": 0.0}


def decoder_options(width: int, variable_window: int) -> dict[str, dict]:
    """Decoder group options of every preset the tests build, by name: label networks and
    joints ``width`` wide, label embeddings, attention and emission layers half that; the
    second-order monotonic decoder's window ``variable_window`` (the first-order one's 3)."""
    half = width // 2

    def label(**context) -> dict:
        return {**context, "embed_dim": half, "hidden": width}

    autoregressive = {"name": "autoregressive", "label": label(), "emission_hidden": half}
    monotonic = {"name": "monotonic", "attention_dim": half, "label": label(), "joint_dim": width}
    transducer = {"name": "transducer", "label": label(), "joint_dim": width}
    hat = {**transducer, "joint": "hat"}
    return {
        "pointwise": {"name": "pointwise"},
        "autoregressive": autoregressive,
        "autoregressive_luo": {**autoregressive, "emission": "decoder"},
        "monotonic": {**monotonic, "window": 3},
        "monotonic_variable": {**monotonic, "window": variable_window, "variable": True},
        "attention_emission": {"name": "attention_emission", "label": label(), "joint_dim": width},
        "transducer": transducer,
        "transducer_context0": {**transducer, "label": label(context=0)},
        "hat": hat,
        "hat_context1": {**hat, "label": label(context=1)},
        "hat_linear": {**hat, "blank_joint": "linear"},
        "tdt": {**transducer, "joint": "tdt", "durations": [0, 1, 2]},
    }


DECODERS = decoder_options(8, variable_window=4)
# decoder preset -> the loss that trains it here
LOSS = {
    "pointwise": "cb_marginal",
    "autoregressive": "cb_reinforce",
    "autoregressive_luo": "forced_suffix",
    "monotonic": "cb_marginal",
    "monotonic_variable": "cb_marginal",
    "attention_emission": "cb_marginal",
    "transducer": "rnnt",
    "hat": "hat",
    "hat_context1": "hat",
    "hat_linear": "hat",
}
CB = [
    "pointwise",
    "autoregressive",
    "autoregressive_luo",
    "monotonic",
    "monotonic_variable",
    "attention_emission",
]
TRANSDUCERS = ["transducer", "hat", "hat_context1", "hat_linear"]
FEATS, VOCAB = 6, 5


def build(
    decoder: str,
    loss: str | None = None,
    seed: int = 0,
    shift: float = 1.5,
    dtype=torch.float32,
    loss_options: dict | None = None,
    decoder_options: dict | None = None,
):
    """A random model in eval mode; ``shift`` moves CB emissions up, HAT blanks down and RNN-T
    blanks up; ``loss_options`` join the loss group (``{"topology": "monotonic"}``) and
    ``decoder_options`` the decoder group."""
    torch.manual_seed(seed)
    loss_cfg = {"name": loss or LOSS[decoder], **(loss_options or {})}
    decoder_cfg = {**DECODERS[decoder], **(decoder_options or {})}
    model = builder.build_model(ENCODER, decoder_cfg, loss_cfg, FEATS, VOCAB)
    d = model.decoder
    with torch.no_grad():
        if isinstance(model, CBModel):  # the emission logit's bias
            d.emission_bias().add_(shift)
        elif isinstance(d, TransducerDecoder) and d.joint.name == "hat":
            j = d.joint
            if j.linear_blank:  # HAT, linear blank: a sharper blank, less likely
                j.blank_encoder.weight.mul_(5.0)
                j.blank_label.weight.mul_(5.0)
                j.blank_encoder.bias.sub_(shift)
            else:  # HAT, blank unit of the joint: frame-dependent
                j.encoder_proj.weight.mul_(8.0)
                j.out[-1].weight[0].mul_(5.0)
                j.out[-1].bias[0].sub_(shift - 0.5)
        elif isinstance(d, TransducerDecoder):  # RNN-T: sharper outputs, the blank up a little
            d.joint.out[-1].weight.mul_(6.0)
            d.joint.out[-1].bias[0].add_(shift / 2)
    return model.to(dtype).eval()


def batch(seed: int = 0, lengths=(23, 17, 9, 4)) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded random features ``(B, T, F)`` and their lengths."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    feats = torch.randn(len(lengths), int(lens.max()), FEATS, generator=g)
    return feats, lens


def blank_bias(model) -> torch.Tensor:
    """The bias that moves a transducer's blank: the linear blank's, or unit 0's of the joint."""
    joint = model.decoder.joint
    if getattr(joint, "linear_blank", False):
        return joint.blank_encoder.bias
    return joint.out[-1].bias[:1]


def emit_about_a_third(model, feats, lens) -> None:
    """Move a transducer's blank bias (bisection) until its greedy search emits about a third
    of the most it can on ``feats``: a random transducer emits on every frame or on none."""
    most = model.max_symbols * int(model.encoder.output_lengths(lens).sum())
    bias, low, high = blank_bias(model), -20.0, 20.0
    base = bias.detach().clone()
    with torch.no_grad():
        for _ in range(30):
            middle = (low + high) / 2
            bias.copy_(base + middle)
            share = sum(map(len, model.greedy_decode(feats, lens))) / most
            if abs(share - 1 / 3) < 0.1:
                return
            low, high = (middle, high) if share > 1 / 3 else (low, middle)
