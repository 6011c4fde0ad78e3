"""cbasr-export: TorchScript and ONNX acoustic models equal the eager ones, and decode."""

import json
import re
import shutil
from pathlib import Path

import onnxruntime
import pytest
import torch

from cbasr.builder import build_model
from cbasr.cli import decode, export
from cbasr.cli.models import compose_model_config
from cbasr.data.features import FeatureStore, write_feature_settings
from cbasr.inference.experiment import Experiment
from cbasr.inference.export import AcousticModel, export_model, exportable
from cbasr.inference.transducer_export import TransducerRuntime
from cbasr.training.options import fbank_options_of
from tests.cli.training import decode_args, train_cli
from tests.inference.fake_experiment import make_experiment
from tests.search import tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cb_trained(tone_data, tmp_path_factory):
    exp = tmp_path_factory.mktemp("export") / "cb"
    run = train_cli(tone_data, exp, "loss=cb_marginal", "trainer.max_epochs=1")
    assert run.returncode == 0, run.stderr[-3000:]
    return exp


def _run(path: Path, fmt: str, feats, lens) -> list[torch.Tensor]:
    if fmt == "torchscript":
        return list(torch.jit.load(str(path))(feats, lens))
    session = onnxruntime.InferenceSession(str(path))
    return [
        torch.from_numpy(o)
        for o in session.run(None, {"feats": feats.numpy(), "lens": lens.numpy()})
    ]


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("family", ["ctc", "cb_pointwise"])
def test_the_exported_model_equals_the_eager_one_on_a_padded_batch(
    family, fmt, tone_data, trained, cb_trained, tmp_path
):
    exp_dir = trained if family == "ctc" else cb_trained
    out = tmp_path / f"model.{fmt}"
    export.main(["--exp-dir", str(exp_dir), "--format", fmt, "--out", str(out)])
    meta = json.loads(out.with_name(out.name + ".json").read_text())
    assert meta["family"] == family and meta["tokens"][0] == "<blk>"
    assert meta["max_abs_difference"] <= 1e-5
    eager = AcousticModel(Experiment(exp_dir).model).eval()
    # real utterances of the tone corpus, normalised, in a batch unlike the traced example
    exp = Experiment(exp_dir)
    store = FeatureStore(tone_data / "fbank/test")
    utts = [exp.normalise(store[u]) for u in sorted(store.index)[:5]]
    lens = torch.tensor([u.shape[0] for u in utts])
    feats = torch.nn.utils.rnn.pad_sequence(utts, batch_first=True)
    with torch.no_grad():
        expected = eager(feats, lens)
    got = _run(out, fmt, feats, lens)
    assert len(got) == len(expected) == len(meta["outputs"])
    assert torch.equal(got[-1].long(), expected[-1])
    for b, n in enumerate(expected[-1].tolist()):
        for ours, theirs in zip(expected[:-1], got[:-1]):
            assert (ours[b, :n] - theirs[b, :n]).abs().max() <= 1e-5
    # the outputs are what the search reads: the docs' greedy rule gives the model's own search
    if family == "ctc":
        hyps = _greedy(family, got)
        assert hyps == eager.model.greedy_decode(feats, lens) and sum(map(len, hyps)) >= 5
    else:  # the CB terms of eq. (38) that training reads, for any target sequence
        targets = torch.tensor([[1, 3, 2]] * len(utts))
        with torch.no_grad():
            emit, terms, _ = eager.model.terms(feats, lens, targets, torch.tensor([3] * len(utts)))
        picked = got[1].gather(2, (targets - 1).unsqueeze(1).expand(-1, got[1].shape[1], -1))
        for b, n in enumerate(expected[-1].tolist()):
            assert (emit[b, :n] - got[0][b, :n]).abs().max() <= 1e-5
            assert (terms[b, :n] - picked[b, :n]).abs().max() <= 1e-5


def _greedy(family: str, outputs: list[torch.Tensor]) -> list[list[int]]:
    """Greedy decoding from the exported outputs, as docs/inference.md describes it."""
    hyps = []
    for b, n in enumerate(outputs[-1].tolist()):
        if family == "ctc":
            best = outputs[0][b, :n].argmax(-1).tolist()
            hyps.append([i for t, i in enumerate(best) if i and (t == 0 or i != best[t - 1])])
            continue
        emit, labels = outputs[0][b, :n], outputs[1][b, :n]
        top, index = labels.max(-1)
        fire = torch.nn.functional.logsigmoid(emit) + top > torch.nn.functional.logsigmoid(-emit)
        hyps.append((index[fire] + 1).tolist())
    return hyps


@pytest.mark.parametrize("decoder,loss", [("attention_emission", "cb_marginal"), ("tdt", "tdt")])
def test_families_whose_search_reads_the_label_history_are_refused(decoder, loss):
    cfg = compose_model_config([f"decoder={decoder}", f"loss={loss}"])
    model = build_model(cfg["encoder"], cfg["decoder"], cfg["loss"], 40, 10)
    assert "CTC, CB with the pointwise decoder, RNN-T and HAT export" in exportable(model)
    with pytest.raises(TypeError, match=type(model).__name__):
        AcousticModel(model)


def _experiment(root, tone_data, decoder, loss, options=None, encoder=None):
    """A random model's experiment with the feature settings a trained one has."""
    exp_dir = make_experiment(root, tone_data, decoder, loss, loss_options=options, encoder=encoder)
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    return exp_dir


TRANSDUCERS = [
    ("transducer", "rnnt", {}),
    ("transducer", "rnnt", {"topology": "monotonic", "greedy": "emission"}),
    ("hat", "hat", {}),
    ("hat_linear", "hat", {}),
    ("hat_context1", "hat", {"topology": "monotonic"}),
    ("transducer_context0", "rnnt", {}),
]


# Conformers, full-context and chunked (streaming), over stacked frames
CONFORMER = {
    "name": "conformer",
    "d_model": 16,
    "num_heads": 2,
    "ffn_dim": 32,
    "num_layers": 2,
    "kernel_size": 5,
    "dropout": 0.0,
    "subsampling": "stack",
    "stack": 3,
    "stride": 3,
}
CHUNKED = {**CONFORMER, "chunk_size": 4, "left_chunks": 1}
CHUNK_CONV = {**CHUNKED, "chunk_conv": "chunk"}  # the convolutions chunk-wise
UNIDIRECTIONAL = {"bidirectional": False}  # the recurrent encoder, streaming


@pytest.mark.parametrize(
    "decoder,loss,options,fmt,encoder",
    [(*t, "torchscript", None) for t in TRANSDUCERS]
    + [(*t, "onnx", None) for t in TRANSDUCERS[2:4]]
    + [
        ("hat", "hat", {}, fmt, enc)
        for fmt in ("torchscript", "onnx")
        for enc in (CONFORMER, CHUNKED)
    ]
    + [
        ("hat_linear", "hat", {}, "onnx", {**CHUNKED, "left_chunks": 0}),
        ("hat", "hat", {}, "onnx", CHUNK_CONV),
        ("hat_linear", "hat", {}, "onnx", UNIDIRECTIONAL),
        ("transducer", "rnnt", {"topology": "monotonic"}, "torchscript", UNIDIRECTIONAL),
    ],
)
def test_an_exported_transducer_s_parts_give_the_eager_greedy_hypotheses(
    decoder, loss, options, fmt, encoder, tone_data, tmp_path
):
    """RNN-T and HAT (every joint, label context and greedy rule, both topologies; recurrent
    and Conformer encoders, full-context and chunked) export as an encoder, a
    prediction-network step and a joint; the greedy search over the exported parts
    (TransducerRuntime) gives the eager model's hypotheses on real utterances. A streaming
    encoder (chunked Conformer, with and without left context; unidirectional LSTM) also
    exports its block step, and the greedy search block by block over it gives them too."""
    exp = Experiment(_experiment(tmp_path / "exp", tone_data, decoder, loss, options, encoder))
    store = FeatureStore(tone_data / "fbank/test")
    utts = [exp.normalise(store[u]) for u in sorted(store.index)[:6]]
    lens = torch.tensor([u.shape[0] for u in utts])
    feats = torch.nn.utils.rnn.pad_sequence(utts, batch_first=True)
    tiny.emit_about_a_third(exp.model, feats, lens)
    out = tmp_path / f"model.{fmt}"
    meta = export_model(exp, fmt, out)
    parts = {name: part["file"] for name, part in meta["parts"].items()}
    streams = (
        encoder in (CHUNKED, CHUNK_CONV, UNIDIRECTIONAL) or (encoder or {}).get("left_chunks") == 0
    )
    assert parts == {
        "encoder": out.name,
        "predictor": f"model.predictor.{fmt}",
        "joint": f"model.joint.{fmt}",
        **({"encoder_step": f"model.encoder_step.{fmt}"} if streams else {}),
    }
    assert all((tmp_path / name).is_file() for name in parts.values())
    assert not list(tmp_path.glob("*.tmp"))
    assert meta["family"] == f"transducer_{loss}" and meta["max_abs_difference"] <= 1e-5
    assert meta["greedy_matches_eager"] is True
    assert json.loads((tmp_path / f"model.{fmt}.json").read_text())["state"] == meta["state"]
    with torch.no_grad():
        eager = exp.model.greedy_decode(feats, lens)
    runtime = TransducerRuntime(out)
    hyps = runtime.greedy(feats, lens)
    assert hyps == eager
    if streams:
        assert meta["stream_greedy_matches_eager"] is True
        assert [runtime.stream_greedy(f[:n]) for f, n in zip(feats, lens.tolist())] == eager
    else:
        assert meta["stream"] is None and "stream" in meta["stream_unavailable"]
        with pytest.raises(ValueError, match="exports no encoder step"):
            runtime.stream_greedy(feats[0])
    frames = exp.model.encoder.output_lengths(lens).tolist()
    assert 0 < sum(map(len, hyps)) < sum(n * exp.model.max_symbols for n in frames)


def test_the_cli_exports_a_transducer(tone_data, tmp_path):
    exp_dir = _experiment(tmp_path / "exp", tone_data, "hat", "hat")
    out = tmp_path / "hat.onnx"
    export.main(["--exp-dir", str(exp_dir), "--format", "onnx", "--out", str(out)])
    meta = json.loads((tmp_path / "hat.onnx.json").read_text())
    assert meta["outputs"][0] == "encoder: enc, out_lens"
    assert meta["tokens"][0] == "<blk>" and meta["subsampling"] == 2
    assert (tmp_path / "hat.predictor.onnx").is_file() and (tmp_path / "hat.joint.onnx").is_file()


def test_the_docs_greedy_decoding_example_gives_the_recipes_hypothesis(
    tone_data, trained, tmp_path
):
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    decode.main(decode_args(tone_data, exp, "test"))
    export.main(["--exp-dir", str(exp), "--format", "onnx", "--out", str(tmp_path / "model.onnx")])
    page = (ROOT / "docs" / "inference.md").read_text()
    code = re.search(r"<!-- export example -->\n```python\n(.*?)```", page, re.S).group(1)
    hyps = {}
    for line in (exp / "decode/test/hyp.trn").read_text().splitlines():
        text, utt = re.fullmatch(r"(.*)\((\S+)\)", line).groups()
        hyps[utt] = text.strip()
    for wav in sorted((tone_data / "corpus/wav/test").glob("*.wav"))[:5]:
        namespace: dict = {}
        source = code.replace('"model.onnx', f'"{tmp_path}/model.onnx').replace(
            '"utterance.wav"', f'"{wav}"'
        )
        exec(compile(source, "docs/inference.md", "exec"), namespace)
        assert namespace["text"] == hyps[wav.stem]


@pytest.mark.parametrize("blank_joint", ["tanh", "linear"])
def test_a_hat_joint_s_label_scores_survive_a_confident_blank_in_onnx(blank_joint, tmp_path):
    """Under a blank logit of 20 to 60 the exported joint's label scores are the eager ones,
    finite: onnxruntime's Log(Sigmoid(x)), what logsigmoid exports as, is -inf there."""
    from cbasr.inference.export import _axes, _save
    from cbasr.inference.transducer_export import LoadedPart, TransducerParts

    options = {"blank_joint": blank_joint}
    model = tiny.build("hat", decoder_options=options)
    joint = model.decoder.joint
    with torch.no_grad():  # the blank logit far up
        if blank_joint == "linear":
            joint.blank_encoder.bias.add_(40.0)
        else:
            joint.out[-1].bias[0].add_(40.0)
    parts = TransducerParts(model)
    inputs = parts.examples(*tiny.batch(seed=1))["joint"]
    path = tmp_path / "joint.onnx"
    _save(parts.modules["joint"], path, "onnx", inputs, parts.names["joint"], _axes)
    blank, labels = LoadedPart(path, "onnx", parts.names["joint"][0])(*inputs)
    with torch.no_grad():
        want_blank, want_labels = parts.modules["joint"](*inputs)
    assert float(-want_labels.max()) > 15  # the blank is confident: labels below e^-15
    assert torch.isfinite(labels).all()
    torch.testing.assert_close(labels, want_labels, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(blank, want_blank, atol=1e-5, rtol=1e-5)
