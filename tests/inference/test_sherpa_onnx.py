"""cbasr-export --format sherpa-onnx: sherpa-onnx, given the exported directory alone (in a
process where cbasr and torch cannot be imported), decodes the tone corpus's test audio to the
greedy hypotheses cbasr's recogniser gives with the same checkpoint."""

import json
import subprocess
import sys
from pathlib import Path

import kaldi_native_fbank as knf
import numpy as np
import onnxruntime
import pytest
import soundfile
import torch

from cbasr import Recognizer
from cbasr.builder import build_model
from cbasr.cli import export
from cbasr.cli.models import compose_model_config
from cbasr.data.features import FbankOptions, FeatureStore, compute_fbank, write_feature_settings
from cbasr.data.manifest import read_manifest
from cbasr.inference.experiment import Experiment
from cbasr.inference.sherpa_export import export_sherpa, sherpa_exportable
from cbasr.storage.checkpoint import save_checkpoint
from cbasr.training.options import fbank_options_of
from tests.cli.test_export import CHUNKED  # a chunked Conformer over stacked frames
from tests.inference.fake_experiment import DECODERS, make_experiment
from tests.search import tiny

# Run with ``python -I``: sherpa-onnx and soundfile only, the model directory, the wavs.
SHERPA = r"""
import json, sys
for name in ("cbasr", "torch", "torchaudio"):
    sys.modules[name] = None  # importing them fails here
from pathlib import Path
import numpy as np, soundfile, sherpa_onnx as so
from sherpa_onnx.lib._sherpa_onnx import OfflineRecognizer

d, kind, wavs = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
features = json.loads((d / "feature_config.json").read_text())
tokens, files = str(d / "tokens.txt"), [str(d / f) for f in ("encoder.onnx", "decoder.onnx", "joiner.onnx")]
audio = [soundfile.read(w, dtype="float32") for w in wavs]
if kind == "online":  # pieces as they arrive, a second of silence after each utterance
    features["sample_rate"] = features.pop("sampling_rate")
    files[0] = str(d / "streaming-encoder.onnx")
    recognizer = so.OnlineRecognizer.from_transducer(tokens, *files, num_threads=1, **features)
    hyps = []
    for samples, rate in audio:
        stream = recognizer.create_stream()
        for piece in np.array_split(np.concatenate([samples, np.zeros(rate, "float32")]), 7):
            stream.accept_waveform(rate, piece)
            while recognizer.is_ready(stream):
                recognizer.decode_stream(stream)
        stream.input_finished()
        while recognizer.is_ready(stream):
            recognizer.decode_stream(stream)
        hyps.append(recognizer.tokens(stream))
    print(json.dumps(hyps))
    sys.exit()
if kind == "ctc":
    model = so.OfflineModelConfig(
        zipformer_ctc=so.OfflineZipformerCtcModelConfig(str(d / "model.onnx")), tokens=tokens)
else:
    model = so.OfflineModelConfig(transducer=so.OfflineTransducerModelConfig(*files),
                                  tokens=tokens, model_type="transducer")
config = so.OfflineRecognizerConfig(feat_config=so.FeatureExtractorConfig(**features),
                                    model_config=model, decoding_method="greedy_search")
recognizer = OfflineRecognizer(config)
streams = [recognizer.create_stream() for _ in audio]
for stream, (samples, rate) in zip(streams, audio):
    stream.accept_waveform(rate, samples)
recognizer.decode_streams(streams)
print(json.dumps([stream.result.tokens for stream in streams]))
"""


def sherpa_hypotheses(model_dir: Path, kind: str, wavs: list[Path], cwd: Path) -> list:
    run = subprocess.run(
        [sys.executable, "-I", "-c", SHERPA, str(model_dir), kind, *map(str, wavs)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def _trained(root: Path, tone_data: Path, decoder, loss, options=None, encoder=None, steps=300):
    """A tiny model of the fake experiment's, trained ``steps`` Adam steps on the tone corpus's
    cached training features (as cbasr-train reads them), saved as its ``best`` checkpoint; a
    transducer that then emits hardly anything on the test split has its blank bias moved until
    it emits about a third of the most it can (:func:`tests.search.tiny.emit_about_a_third`)."""
    torch.set_num_threads(1)
    exp_dir = make_experiment(root, tone_data, decoder, loss, loss_options=options, encoder=encoder)
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    exp = Experiment(exp_dir)
    model = exp.model.train()
    store = FeatureStore(tone_data / "fbank/train")
    records = read_manifest(tone_data / "corpus/train.jsonl")
    feats = [exp.normalise(store[r["id"]]) for r in records]
    targets = [torch.tensor(exp.vocab.encode(r["phones"])) for r in records]
    optimiser = torch.optim.Adam(model.parameters(), lr=0.03)
    generator = torch.Generator().manual_seed(0)
    pad = torch.nn.utils.rnn.pad_sequence
    for _ in range(steps):
        batch = torch.randperm(len(feats), generator=generator)[:32].tolist()
        out = model.loss(
            pad([feats[i] for i in batch], batch_first=True),
            torch.tensor([feats[i].shape[0] for i in batch]),
            pad([targets[i] for i in batch], batch_first=True),
            torch.tensor([len(targets[i]) for i in batch]),
        )
        optimiser.zero_grad()
        (out.loss.sum() / sum(len(targets[i]) for i in batch)).backward()
        optimiser.step()
    model.eval()
    if loss != "ctc":
        test = FeatureStore(tone_data / "fbank/test")
        feats = [exp.normalise(test[u]) for u in sorted(test.index)]
        lens = torch.tensor([f.shape[0] for f in feats])
        with torch.no_grad():
            emitted = sum(map(len, model.greedy_decode(pad(feats, batch_first=True), lens)))
        if emitted < 2 * len(feats):
            tiny.emit_about_a_third(model, pad(feats, batch_first=True), lens)
    checkpoint = exp_dir / "checkpoints/best.pt"
    saved = torch.load(checkpoint, weights_only=False)
    save_checkpoint(checkpoint, {**saved, "model": model.state_dict()})
    return exp_dir


def _test_wavs(tone_data: Path) -> list[Path]:
    return sorted((tone_data / "corpus/wav/test").glob("*.wav"))


def _check_hypotheses(got: list, want: list) -> None:
    assert got == want
    assert sum(map(len, want)) >= 2 * len(want)  # not trivially empty
    assert len({token for hyp in want for token in hyp}) >= 2


def test_the_feature_config_gives_cbasr_s_filterbanks(tone_data, tmp_path):
    """kaldi-native-fbank (what sherpa-onnx computes its features with), set up as
    sherpa-onnx's OfflineStream sets it from feature_config.json, gives compute_fbank's
    features on the test audio and on audio with digital silence; sherpa-onnx's defaults do
    not."""
    exp_dir = _trained(tmp_path / "exp", tone_data, "pointwise", "ctc", steps=0)
    config = export_sherpa(Experiment(exp_dir), tmp_path / "sherpa")["feature_config"]
    defaults = {**config, "high_freq": -400.0, "snip_edges": False, "normalize_samples": True}
    silence = np.zeros(4000, dtype=np.float32)
    audio = [soundfile.read(w, dtype="float32")[0] for w in _test_wavs(tone_data)[:6]]
    audio.append(np.concatenate([audio[0], silence, audio[1]]))
    worst = 0.0
    for samples in audio:
        ours = compute_fbank(torch.from_numpy(samples), 16000, FbankOptions(num_mel_bins=40))
        theirs = _kaldi_native_fbank(samples, config)
        assert theirs.shape == ours.shape
        worst = max(worst, float(np.abs(theirs - ours.numpy()).max()))
        other = _kaldi_native_fbank(samples, defaults)
        assert other.shape != ours.shape or np.abs(other - ours.numpy()).max() > 1.0
    assert worst < 1e-3


def _kaldi_native_fbank(samples: np.ndarray, config: dict) -> np.ndarray:
    """The features sherpa-onnx's OfflineStream computes (offline-stream.cc) for ``config``."""
    opts = knf.FbankOptions()
    frame = opts.frame_opts
    frame.dither, frame.snip_edges = config["dither"], config["snip_edges"]
    frame.samp_freq = config["sampling_rate"]
    frame.frame_shift_ms, frame.frame_length_ms = 10.0, 25.0
    frame.remove_dc_offset, frame.window_type = True, "povey"
    opts.mel_opts.num_bins = config["feature_dim"]
    opts.mel_opts.low_freq, opts.mel_opts.high_freq = config["low_freq"], config["high_freq"]
    opts.mel_opts.is_librosa = False
    fbank = knf.OnlineFbank(opts)
    scale = 1.0 if config["normalize_samples"] else 32768.0
    fbank.accept_waveform(config["sampling_rate"], (samples * scale).tolist())
    fbank.input_finished()
    return np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])


def test_a_ctc_model_decodes_in_sherpa_onnx_as_in_cbasr(tone_data, tmp_path):
    exp_dir = _trained(tmp_path / "exp", tone_data, "pointwise", "ctc", steps=200)
    out = tmp_path / "sherpa"
    export.main(["--exp-dir", str(exp_dir), "--format", "sherpa-onnx", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == [
        "export.json", "feature_config.json", "model.onnx", "tokens.txt"
    ]  # fmt: skip
    assert (out / "tokens.txt").read_text().splitlines()[0] == "<blk> 0"
    wavs = _test_wavs(tone_data)
    recognizer = Recognizer.from_pretrained(exp_dir)
    want = [t.tokens for t in recognizer.transcribe(wavs)]
    _check_hypotheses(sherpa_hypotheses(out, "ctc", wavs, tmp_path), want)
    # model.onnx on raw filterbanks: the model on cbasr's (float16-rounded, normalised) ones
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), options)
    for wav in wavs[:4]:
        samples, rate = soundfile.read(wav, dtype="float32")
        raw = compute_fbank(torch.from_numpy(samples), rate, recognizer.features.fbank)
        feed = {"x": raw[None].numpy(), "x_lens": np.array([raw.shape[0]])}
        theirs = torch.from_numpy(session.run(None, feed)[0])
        with torch.no_grad():
            ours = recognizer.experiment.model.log_probs(
                recognizer.features_of(wav)[None], torch.tensor([raw.shape[0]])
            )[0]
        assert (theirs - ours).abs().max() < 1e-4


@pytest.mark.parametrize(
    "decoder,loss,options",
    [
        ("transducer", "rnnt", {}),  # the LSTM prediction network
        ("hat", "hat", {"greedy": "emission"}),
        ("hat_linear", "hat", {}),  # the linear blank: a last channel of encoder_out
        ("hat_context2", "hat", {"topology": "monotonic"}),  # the last 2 labels, -1 padded
        ("transducer_context0", "rnnt", {}),
    ],
)
def test_a_transducer_decodes_in_sherpa_onnx_as_in_cbasr(
    decoder, loss, options, tone_data, tmp_path, monkeypatch
):
    """RNN-T and HAT, each label context, greedy rule and topology, with at most one label a
    frame (sherpa-onnx's greedy search)."""
    context1 = DECODERS["hat_context1"]
    context2 = {**context1, "label": {**context1["label"], "context": 2}}
    monkeypatch.setitem(DECODERS, "hat_context2", context2)
    options = {"max_symbols": 1, **options}
    exp_dir = _trained(tmp_path / "exp", tone_data, decoder, loss, options)
    out = tmp_path / "sherpa"
    meta = export_sherpa(Experiment(exp_dir), out)
    assert meta["streaming"] is not None  # a bidirectional encoder: no streaming encoder
    assert not (out / "streaming-encoder.onnx").exists() and not list(tmp_path.glob("*.tmp"))
    wavs = _test_wavs(tone_data)
    want = [t.tokens for t in Recognizer.from_pretrained(exp_dir).transcribe(wavs)]
    _check_hypotheses(sherpa_hypotheses(out, "transducer", wavs, tmp_path), want)


@pytest.mark.parametrize("encoder", [{"bidirectional": False}, CHUNKED], ids=["ulstm", "chunked"])
def test_a_streaming_transducer_decodes_in_sherpa_onnx_s_online_recognizer(
    encoder, tone_data, tmp_path
):
    """A unidirectional LSTM (icefall's "lstm" layout) and a chunked Conformer ("conformer"),
    fed in pieces with trailing silence: sherpa-onnx's online hypotheses are cbasr's greedy
    ones on the feature frames of the chunks it decoded (its offline recogniser's too)."""
    exp_dir = _trained(tmp_path / "exp", tone_data, "hat", "hat", {"max_symbols": 1}, encoder)
    out = tmp_path / "sherpa"
    meta = export_sherpa(Experiment(exp_dir), out)
    assert meta["streaming"] is None
    assert meta["stream"]["model_type"] == ("lstm" if encoder is not CHUNKED else "conformer")
    frames, shift = meta["stream"]["T"], meta["stream"]["decode_chunk_len"]
    recognizer = Recognizer.from_pretrained(exp_dir)
    model = recognizer.experiment.model
    wavs = _test_wavs(tone_data)
    want = []
    for wav in wavs:
        samples, rate = soundfile.read(wav, dtype="float32")
        padded = np.concatenate([samples, np.zeros(rate, dtype=np.float32)])
        feats = recognizer.features_of(torch.from_numpy(padded), rate)
        chunks = 0
        while chunks * shift + frames < feats.shape[0]:  # sherpa-onnx's IsReady
            chunks += 1
        decoded = feats[None, : chunks * shift]  # (stack = stride: whole stacked frames)
        with torch.no_grad():
            ids = model.greedy_decode(decoded, torch.tensor([decoded.shape[1]]))[0]
        want.append(recognizer.experiment.vocab.decode(ids))
    _check_hypotheses(sherpa_hypotheses(out, "online", wavs, tmp_path), want)
    offline = [t.tokens for t in recognizer.transcribe(wavs)]
    assert sherpa_hypotheses(out, "transducer", wavs, tmp_path) == offline


@pytest.mark.parametrize(
    "decoder,loss,reason",
    [("tdt", "tdt", "NeMo"), ("attention_emission", "cb_marginal", "CTC and transducer")],
)
def test_tdt_and_cb_are_refused_with_the_reason(decoder, loss, reason):
    cfg = compose_model_config([f"decoder={decoder}", f"loss={loss}"])
    model = build_model(cfg["encoder"], cfg["decoder"], cfg["loss"], 40, 10)
    assert reason in sherpa_exportable(model)


def test_utterance_mean_normalisation_is_refused_with_the_reason():
    from dataclasses import replace

    from cbasr.data.features import FeatureSettings

    cfg = compose_model_config(["decoder=pointwise", "loss=ctc"])
    model = build_model(cfg["encoder"], cfg["decoder"], cfg["loss"], 40, 10)
    settings = FeatureSettings(
        FbankOptions(num_mel_bins=40), torch.zeros(40), torch.ones(40), False
    )
    assert sherpa_exportable(model, settings) is None
    assert "mean_norm=utterance" in sherpa_exportable(model, replace(settings, utterance_mean=True))


def test_the_deploy_page_s_example_decodes_as_cbasr(tone_data, tmp_path):
    """docs/deploy.md's Python block, run with no cbasr, on an exported HAT and a test file."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs/deploy.md").read_text()
    code = re.search(r"<!-- deploy example -->\n```python\n(.*?)```", page, re.S).group(1)
    exp_dir = _trained(tmp_path / "exp", tone_data, "hat", "hat", {"max_symbols": 1})
    export_sherpa(Experiment(exp_dir), tmp_path / "hat_sherpa")
    wav = _test_wavs(tone_data)[0]
    (tmp_path / "a.wav").write_bytes(wav.read_bytes())
    guard = (
        "import sys\nfor name in ('cbasr', 'torch', 'torchaudio'):\n    sys.modules[name] = None\n"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-c", guard + code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    want = Recognizer.from_pretrained(exp_dir).transcribe([wav])[0].tokens
    assert len(want) >= 2 and run.stdout.strip() == str(want)
