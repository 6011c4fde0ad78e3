"""Experiment directories with random (untrained) models on the tone corpus, written the way
the trainer writes them, for decoding, alignment and comparison tests that need no training."""

import shutil
from pathlib import Path

import torch

from cbasr import builder
from cbasr.data.vocab import Vocabulary
from cbasr.storage.checkpoint import save_checkpoint
from tests.search import tiny

ENCODER = {
    "name": "rnn",
    "hidden": 8,
    "num_layers": 1,
    "stack": 2,
    "stride": 2,
    "dropout": 0.0,
    "bidirectional": True,
    "rnn_type": "lstm",
    "subsampling": "stack",
    "embedding_dim": 8,
}
DECODERS = dict(tiny.DECODERS)


def make_experiment(
    root: Path,
    tone_data: Path,
    decoder: str,
    loss: str,
    seed: int = 0,
    epoch: int = 3,
    emission_shift: float = 2.0,
    loss_options: dict | None = None,
    encoder: dict | None = None,
) -> Path:
    """``root`` as a trained experiment: config, vocabulary, CMVN and ``checkpoints/best.pt``.

    CB models get ``emission_shift`` added to their emission bias (random ones hardly emit);
    ``loss_options`` are added to the loss group (``{"topology": "monotonic"}``), ``encoder``
    to the encoder group (``{"bidirectional": False}``), or replace it where they name one
    (``{"name": "conformer", ...}``)."""
    vocab = Vocabulary.load(tone_data / "lang" / "phones.txt")
    torch.manual_seed(seed)
    loss_cfg = {"name": loss, **({"max_symbols": 3} if loss in ("rnnt", "hat") else {})}
    loss_cfg.update(loss_options or {})
    # another encoder by name (a whole config), or options of the default one
    encoder_cfg = dict(encoder) if "name" in (encoder or {}) else {**ENCODER, **(encoder or {})}
    model = builder.build_model(encoder_cfg, DECODERS[decoder], loss_cfg, 40, len(vocab))
    with torch.no_grad():
        if loss == "cb_marginal":
            model.decoder.emission_bias().add_(emission_shift)
    cfg = {
        "encoder": encoder_cfg,
        "decoder": DECODERS[decoder],
        "loss": loss_cfg,
        "data": {
            "units": "phones",
            "manifest_dir": str(tone_data / "corpus"),
            "feature_dir": str(tone_data / "fbank"),
            "vocab": str(tone_data / "lang/phones.txt"),
        },
    }
    root.mkdir(parents=True, exist_ok=True)
    vocab.save(root / "vocab.txt")
    shutil.copy(tone_data / "fbank" / "cmvn.json", root / "cmvn.json")
    save_checkpoint(
        root / "checkpoints" / "best.pt",
        {"config": cfg, "state": {"epoch": epoch}, "model": model.state_dict()},
    )
    return root


def make_streaming_experiment(root: Path, tone_data: Path, wavs: list[Path]) -> Path:
    """A random HAT experiment over a unidirectional LSTM (streamable), its blank bias moved
    until it emits about a third of the most it can on ``wavs``."""
    from cbasr import Recognizer
    from cbasr.data.features import write_feature_settings
    from cbasr.training.options import fbank_options_of

    exp_dir = make_experiment(root, tone_data, "hat", "hat", encoder={"bidirectional": False})
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    recognizer = Recognizer.from_pretrained(exp_dir)
    feats = [recognizer.features_of(w) for w in wavs]
    lens = torch.tensor([f.shape[0] for f in feats])
    model = recognizer.experiment.model
    tiny.emit_about_a_third(model, torch.nn.utils.rnn.pad_sequence(feats, batch_first=True), lens)
    checkpoint = exp_dir / "checkpoints/best.pt"
    saved = torch.load(checkpoint, weights_only=False)
    save_checkpoint(checkpoint, {**saved, "model": model.state_dict()})
    return exp_dir
