"""A trained experiment directory used outside the recipe: cbasr-transcribe and the Recognizer."""

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from cbasr import Recognizer
from cbasr.cli import decode, transcribe
from cbasr.inference.recognizer import RecognizerStream
from tests.cli.training import decode_args
from tests.inference.fake_experiment import make_streaming_experiment

ROOT = Path(__file__).resolve().parents[2]


def _hyps(trn: Path) -> dict[str, str]:
    """``{utt: hypothesis}`` of a trn file."""
    out = {}
    for line in trn.read_text().splitlines():
        text, utt = re.fullmatch(r"(.*)\((\S+)\)", line).groups()
        out[utt] = text.strip()
    return out


def _test_wavs(tone_data) -> list[Path]:
    return sorted((tone_data / "corpus/wav/test").glob("*.wav"))


@pytest.fixture(scope="module")
def decoded(tone_data, trained, tmp_path_factory) -> Path:
    """A copy of the trained experiment with its greedy decoding of test."""
    exp = tmp_path_factory.mktemp("transcribe") / "exp"
    shutil.copytree(trained, exp)
    decode.main(decode_args(tone_data, exp, "test"))
    return exp


def test_the_experiment_directory_records_its_feature_settings(trained):
    settings = json.loads((trained / "features.json").read_text())
    assert settings["fbank"]["num_mel_bins"] == 40 and settings["stored_as"] == "float16"
    assert len(settings["cmvn_sha256"]) == 64


def test_transcribe_prints_the_recipes_hypothesis_of_every_file(
    tone_data, decoded, capsys, monkeypatch
):
    wavs = _test_wavs(tone_data)
    transcribe.main(["--exp-dir", str(decoded), *map(str, wavs)])
    lines = capsys.readouterr().out.splitlines()
    printed = dict(line.split("\t") for line in lines)
    expected = {
        str(w): h
        for w in wavs
        for u, h in _hyps(decoded / "decode/test/hyp.trn").items()
        if w.stem == u
    }
    assert len(printed) == len(wavs) == 16
    assert printed == expected
    assert sum(bool(h) for h in printed.values()) >= 12  # a trained model, not empty output
    # a directory, and a list on stdin, name the same files
    transcribe.main(["--exp-dir", str(decoded), str(tone_data / "corpus/wav/test")])
    assert capsys.readouterr().out.splitlines() == lines
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{w}\n" for w in wavs)))
    transcribe.main(["--exp-dir", str(decoded), "-"])
    assert capsys.readouterr().out.splitlines() == lines


def test_timestamps_are_a_ctm_of_the_hypothesis(tone_data, decoded, capsys):
    wavs = _test_wavs(tone_data)[:4]
    transcribe.main(["--exp-dir", str(decoded), *map(str, wavs)])
    hyps = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    transcribe.main(["--exp-dir", str(decoded), "--timestamps", *map(str, wavs)])
    ctm = [line.split() for line in capsys.readouterr().out.splitlines()]
    for wav in wavs:
        rows = [r for r in ctm if r[0] == str(wav)]
        assert [r[4] for r in rows] == hyps[str(wav)].split()
        starts = [float(r[2]) for r in rows]
        duration = soundfile.info(wav).duration
        assert starts == sorted(starts) and all(0 <= s < duration for s in starts)
        assert all(r[1] == "1" and float(r[3]) > 0 for r in rows)


def test_stream_prints_a_partial_line_only_when_the_hypothesis_changes(
    tone_data, tmp_path, capsys, monkeypatch
):
    """``--stream``: after each piece of audio, a ``PATH [partial] TEXT`` line exactly when the
    hypothesis differs from the one last printed (none for the empty one before the first
    label, none for a piece that leaves it as it was), checked against the hypotheses the
    streams returned; so no partial line repeats the one before it."""
    torch.set_num_threads(1)  # tiny steps: one thread is fastest (put back by the conftest)
    wavs = _test_wavs(tone_data)[:2]
    exp_dir = make_streaming_experiment(tmp_path / "exp", tone_data, wavs)
    returned: dict[str, list[str]] = {}
    real_accept = RecognizerStream.accept

    def accept(self, samples):
        result = real_accept(self, samples)
        returned.setdefault(self.name, []).append(result.text)
        return result

    monkeypatch.setattr(RecognizerStream, "accept", accept)
    transcribe.main(["--exp-dir", str(exp_dir), "--stream", "--chunk-ms", "50", *map(str, wavs)])
    err = capsys.readouterr().err.splitlines()
    assert sorted(returned) == sorted(map(str, wavs))
    for wav in wavs:
        texts = returned[str(wav)]
        # the test's premise: some piece left a hypothesis with labels as it was
        assert any(text and text == last for last, text in zip(texts, texts[1:])), texts
        changes = [text for last, text in zip(["", *texts], texts) if text != last]
        assert changes  # and some piece changed it
        prefix = f"{wav} [partial] "
        partials = [line[len(prefix) :] for line in err if line.startswith(prefix)]
        assert partials == changes
        assert all(a != b for a, b in zip(partials, partials[1:]))


def test_unreadable_files_are_named_and_counted_and_the_rest_recognised(
    tone_data, decoded, tmp_path, capsys
):
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"not audio at all" * 10)
    good = _test_wavs(tone_data)[0]
    with pytest.raises(SystemExit) as exit_:
        transcribe.main(
            ["--exp-dir", str(decoded), str(good), str(garbage), str(tmp_path / "missing.wav")]
        )
    assert exit_.value.code == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith(f"{good}\t") and len(out.splitlines()) == 1
    assert "garbage.wav" in err and "missing.wav" in err
    assert "2 of 3 files could not be recognised" in err


def test_recognizer_reads_any_rate_and_channel_count(tone_data, decoded, tmp_path, caplog):
    wav = _test_wavs(tone_data)[1]
    recognizer = Recognizer.from_pretrained(decoded)
    expected = _hyps(decoded / "decode/test/hyp.trn")[wav.stem]
    (result,) = recognizer.transcribe(wav)
    assert result.text == expected and result.tokens == expected.split()
    assert result.times is None and result.source == str(wav)
    samples, rate = soundfile.read(wav, dtype="float32")
    noise = 0.3 * np.random.default_rng(0).standard_normal(samples.size).astype(np.float32)
    stereo = tmp_path / "stereo.flac"
    soundfile.write(stereo, np.stack([samples, noise], axis=1), rate, subtype="PCM_16")
    with caplog.at_level("INFO"):
        (from_stereo,) = recognizer.transcribe([stereo])
    assert from_stereo.text == expected  # the first channel, as FLAC: the same samples
    assert "2 channels: recognising the first" in caplog.text
    # a waveform at another rate is resampled to the model's; the tones survive it
    at_48k = torch.from_numpy(samples).repeat_interleave(3)  # 48 kHz, crude but tone-preserving
    with caplog.at_level("INFO"):
        (resampled,) = recognizer.transcribe(at_48k, sample_rate=48000, timestamps=True)
    assert "resampling 48000 Hz audio to the model's 16000 Hz" in caplog.text
    assert resampled.source == "<waveform 0>" and len(resampled.times) == len(resampled.tokens)
    with pytest.raises(ValueError, match="sample_rate"):
        recognizer.transcribe(torch.zeros(16000))


def test_a_replaced_cmvn_file_is_refused(decoded, tmp_path):
    exp = tmp_path / "exp"
    shutil.copytree(decoded, exp)
    stats = json.loads((exp / "cmvn.json").read_text())
    stats["mean"][0] += 1.0
    (exp / "cmvn.json").write_text(json.dumps(stats))
    with pytest.raises(ValueError, match="differs from the statistics the model was trained"):
        Recognizer.from_pretrained(exp)


def test_an_experiment_without_features_json_falls_back_to_its_training_features(
    tone_data, decoded, tmp_path
):
    exp = tmp_path / "exp"
    shutil.copytree(decoded, exp)
    (exp / "features.json").unlink()
    wav = _test_wavs(tone_data)[2]
    (result,) = Recognizer.from_pretrained(exp).transcribe(wav)
    assert result.text == _hyps(decoded / "decode/test/hyp.trn")[wav.stem]
    checkpoint = torch.load(exp / "checkpoints/best.pt", weights_only=False)
    checkpoint["config"]["data"]["feature_dir"] = str(tmp_path / "gone")
    torch.save(checkpoint, exp / "checkpoints/best.pt")
    with pytest.raises(FileNotFoundError, match="features.json not found"):
        Recognizer.from_pretrained(exp)


def test_the_docs_example_runs(tone_data, decoded):
    """The Python example of docs/inference.md, with its experiment and audio paths pointed at
    the tone model."""
    page = (ROOT / "docs" / "inference.md").read_text()
    code = re.search(r"<!-- recognizer example -->\n```python\n(.*?)```", page, re.S).group(1)
    wav = _test_wavs(tone_data)[3]
    code = code.replace("recipes/synth/exp/blstm_ctc", str(decoded))
    code = re.sub(r'"recipes/synth/data/synth/[^"]*\.wav"', f'"{wav}"', code)
    namespace: dict = {}
    exec(compile(code, "docs/inference.md", "exec"), namespace)
    assert namespace["result"].text == _hyps(decoded / "decode/test/hyp.trn")[wav.stem]


def test_features_of_a_file_are_exactly_the_training_features(tone_data, decoded):
    """The cached features (float16) normalised by the experiment's CMVN: bit for bit."""
    from cbasr.data.features import FeatureStore, load_cmvn

    store = FeatureStore(tone_data / "fbank/test")
    mean, std = load_cmvn(decoded / "cmvn.json")
    recognizer = Recognizer.from_pretrained(decoded)
    for wav in _test_wavs(tone_data)[:3]:
        assert torch.equal(recognizer.features_of(wav), (store[wav.stem] - mean) / std)
