"""trainer.emit_bias_init: a new CB run's emission bias at the training data's label rate (or a
given value), computed from the dataset's frame and label counts; never on resume or with
init_from."""

import json
import logging
import math

import pytest
import torch

from cbasr import builder
from cbasr.data.dataset import collate
from cbasr.modules.encoders import RNNEncoder
from cbasr.training.asr_task import asr_trainer
from cbasr.training.emission_bias import emit_bias_option, init_emission_bias, label_rate
from cbasr.training.trainer import Trainer
from tests.inference.fake_experiment import DECODERS, ENCODER
from tests.training.test_trainer import make_cfg


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _hand_rate(tone_data, trainer: Trainer) -> float:
    """Labels (the manifest's phones) per encoder frame (the blstm preset: ceil(T / 3))."""
    manifest = tone_data / "corpus" / "train.jsonl"
    labels = sum(len(json.loads(line)["phones"]) for line in manifest.read_text().splitlines())
    frames = sum(math.ceil(n / 3) for n in trainer.task.train_set.num_frames)
    assert len(trainer.task.train_set) == 160  # every utterance usable: the manifest's counts
    return labels / frames


def _bias(trainer: Trainer) -> float:
    return float(trainer.model.decoder.emission_bias().detach())


@torch.no_grad()
def _mean_emission_probability(trainer: Trainer) -> float:
    """Mean ``P(B_t = 1)`` over every valid encoder frame of the training set (eval mode)."""
    model, data = trainer.model.eval(), trainer.task.train_set
    total, frames = 0.0, 0
    for start in range(0, len(data), 32):
        batch = collate([data[i] for i in range(start, min(start + 32, len(data)))])
        h, lens = model.encoder(batch.feats, batch.feat_lens)  # (B, T', D), (B,)
        emit_logits, _ = model.decoder.frame_outputs(h)  # (B, T')
        valid = torch.arange(h.shape[1]) < lens.unsqueeze(1)  # (B, T')
        total += float((torch.sigmoid(emit_logits) * valid).sum())
        frames += int(lens.sum())
    return total / frames


def test_a_new_run_starts_at_the_label_rate_computed_by_hand(tone_data, tmp_path, caplog):
    exp = tmp_path / "cb"
    trainer = asr_trainer(
        make_cfg(tone_data, exp, "loss=cb_marginal", "trainer.emit_bias_init=label_rate"), exp
    )
    with caplog.at_level(logging.INFO):
        trainer.initialise()
    rate = _hand_rate(tone_data, trainer)
    assert 0.05 < rate < 0.5
    assert _bias(trainer) == pytest.approx(_logit(rate), abs=1e-6)
    assert f"= {rate:.4f} per frame, bias logit({rate:.4f}) = {_logit(rate):.4f}" in caplog.text
    # the model's mean P(B_t = 1) at the start is the label rate (the rest of the logit is
    # near zero-mean), where the decoder's own initialisation starts near 1/2
    assert _mean_emission_probability(trainer) == pytest.approx(rate, rel=0.15)
    plain = tmp_path / "plain"
    untouched = asr_trainer(make_cfg(tone_data, plain, "loss=cb_marginal"), plain)
    untouched.initialise()
    assert abs(_mean_emission_probability(untouched) - 0.5) < 0.1
    assert _bias(untouched) == _bias(
        asr_trainer(make_cfg(tone_data, tmp_path / "again", "loss=cb_marginal"), tmp_path / "again")
    )  # the default leaves the seeded initialisation as it was


def test_resume_and_init_from_keep_their_bias(tone_data, tmp_path, caplog):
    exp = tmp_path / "cb"
    cfg = make_cfg(tone_data, exp, "loss=cb_marginal", "trainer.emit_bias_init=label_rate")
    first = asr_trainer(cfg, exp)
    first.initialise()
    with torch.no_grad():
        first.model.decoder.emission_bias().fill_(0.25)  # as if trained
    first.save("last")
    resumed = asr_trainer(cfg, exp)
    with caplog.at_level(logging.INFO):
        resumed.initialise()
    assert _bias(resumed) == 0.25
    assert "resuming: trainer.emit_bias_init=label_rate is not used" in caplog.text
    tuned = tmp_path / "tuned"
    fine = asr_trainer(
        make_cfg(
            tone_data,
            tuned,
            "loss=cb_marginal",
            "trainer.emit_bias_init=-3.0",
            f"trainer.init_from={exp / 'checkpoints' / 'last.pt'}",
        ),
        tuned,
    )
    with caplog.at_level(logging.INFO):
        fine.initialise()
    assert _bias(fine) == 0.25 and "trainer.emit_bias_init=-3.0 is not used" in caplog.text


def test_a_number_sets_the_bias_and_anything_else_fails_at_start(tone_data, tmp_path):
    exp = tmp_path / "cb"
    trainer = asr_trainer(
        make_cfg(tone_data, exp, "loss=cb_marginal", "trainer.emit_bias_init=-2"), exp
    )
    trainer.initialise()
    assert _bias(trainer) == -2.0
    with pytest.raises(ValueError, match="trainer.emit_bias_init must be one of"):
        asr_trainer(
            make_cfg(tone_data, tmp_path / "x", "trainer.emit_bias_init=labelrate"), tmp_path / "x"
        )
    ctc = tmp_path / "ctc"
    with pytest.raises(ValueError, match="CTCModel has no emission logits"):
        asr_trainer(make_cfg(tone_data, ctc, "trainer.emit_bias_init=label_rate"), ctc).initialise()
    assert emit_bias_option("decoder") == "decoder" and emit_bias_option("0.5") == 0.5
    for bad in ("nan", "inf", ""):
        with pytest.raises(ValueError):
            emit_bias_option(bad)


@pytest.mark.parametrize("decoder", ["attention_emission", "monotonic_variable", "autoregressive"])
def test_every_cb_decoder_takes_the_bias(decoder):
    loss = "cb_reinforce" if decoder == "autoregressive" else "cb_marginal"
    model = builder.build_model(ENCODER, DECODERS[decoder], {"name": loss}, 40, 6)
    # stride 2: 7 + 4 frames -> 4 + 2 encoder frames for 3 labels: rate 1/2, bias 0; 1 label: logit(1/6)
    assert label_rate(model.encoder, [7, 4], [2, 1]) == (0.5, 3, 6)
    assert init_emission_bias(model, "label_rate", [7, 4], [1, 0]) == pytest.approx(_logit(1 / 6))
    assert float(model.decoder.emission_bias().detach()) == pytest.approx(_logit(1 / 6))
    h = torch.zeros(1, 5, model.encoder.output_dim)
    emit_logits = (
        model.decoder.emission_logits(h)
        if decoder == "autoregressive"
        else model.decoder.begin(h, torch.tensor([5]))["emit_logits"]
    )
    assert emit_logits.shape == (1, 5) and torch.allclose(
        torch.sigmoid(emit_logits), torch.tensor(1 / 6), atol=0.1
    )
    assert init_emission_bias(model, "decoder", [7], [1]) is None


def test_the_label_rate_counts_frames_after_subsampling():
    stack = RNNEncoder(input_dim=4, hidden=4, num_layers=1, stack=3, stride=3)
    rate, labels, frames = label_rate(stack, [9, 10, 1], [3, 2, 1])
    assert (labels, frames) == (6, 3 + 4 + 1) and rate == 6 / 8
    with pytest.raises(ValueError, match="no encoder frames"):
        label_rate(stack, [], [])
