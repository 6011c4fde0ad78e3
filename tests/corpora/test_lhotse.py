"""lhotse manifests as lhotse itself writes them (recordings, supervisions, cuts; gzipped JSONL;
supervisions that are parts of recordings; a second channel; relative paths), and the Kaldi
directories lhotse exports, imported; the audio each utterance reads is lhotse's own."""

import json

import numpy as np
import pytest
import soundfile
import torch

from cbasr.cli import features, prepare
from cbasr.corpora.lhotse import _source, prepare_lhotse
from cbasr.corpora.prepare import CorpusError
from cbasr.data.audio import read_segment
from cbasr.data.features import FbankOptions, FeatureStore, compute_fbank

lhotse = pytest.importorskip("lhotse")
from lhotse.kaldi import export_to_kaldi  # noqa: E402

RATE = 16000


def _tones(seconds: float, frequencies: list[float], seed: int) -> np.ndarray:
    """``(N, C)``: a tone of its own per channel, and a little noise."""
    t = np.arange(int(seconds * RATE)) / RATE
    noise = np.random.default_rng(seed).standard_normal((t.size, len(frequencies)))
    return np.stack([0.3 * np.sin(2 * np.pi * f * t) for f in frequencies], 1) + 0.01 * noise


@pytest.fixture()
def corpus(tmp_path, monkeypatch):
    """Audio and lhotse's manifests in ``tmp_path/corpus``, the sources relative to it."""
    root = tmp_path / "corpus"
    (root / "audio").mkdir(parents=True)
    monkeypatch.chdir(root)
    soundfile.write("audio/stereo.wav", _tones(3.0, [300, 1200], 0), RATE, subtype="PCM_16")
    soundfile.write("audio/mono.flac", _tones(2.5, [700], 1), RATE, subtype="PCM_16")
    soundfile.write("audio/mono.wav", _tones(2.0, [500], 2), RATE, subtype="PCM_16")
    recordings = lhotse.RecordingSet.from_recordings(
        lhotse.Recording.from_file(f"audio/{name}", recording_id=rec)
        for rec, name in (("stereo", "stereo.wav"), ("flac", "mono.flac"), ("wav", "mono.wav"))
    )
    sup = lhotse.SupervisionSegment
    supervisions = lhotse.SupervisionSet.from_segments(
        [
            sup("stereo-a", "stereo", 0.25, 1.0, channel=1, text="right one", speaker="s1"),
            sup("stereo-b", "stereo", 1.5, 1.25, channel=0, text="left two", speaker="s2"),
            sup("flac-a", "flac", 0.5, 1.5, channel=0, text="x y", speaker="s3"),
        ]
    )
    recordings.to_file("recordings.jsonl.gz")
    supervisions.to_file("supervisions.jsonl.gz")
    cuts = lhotse.CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    cuts.trim_to_supervisions().to_file("cuts.jsonl.gz")
    return root


def _records(path):
    return {json.loads(line)["id"]: json.loads(line) for line in path.read_text().splitlines()}


def _assert_lhotse_audio(records, cuts):
    """Each record reads what lhotse loads for the supervision of the same id."""
    for cut in cuts:
        record = records[cut.supervisions[0].id]
        ours, rate = read_segment(
            record["audio"], record["start"], record["duration"], record.get("channel", 0)
        )
        theirs = cut.load_audio()  # (channels, samples)
        assert rate == RATE and theirs.shape == (1, ours.size), cut.id
        np.testing.assert_allclose(ours, theirs[0], atol=1e-6)


def test_lhotse_s_own_manifests_import_with_their_channels_and_parts(corpus, tmp_path):
    out = tmp_path / "out"
    prepare.main(
        ["lhotse", "--manifests", "train=cuts.jsonl.gz", "dev=recordings.jsonl.gz",
         "dev=supervisions.jsonl.gz", "--out", str(out)]
    )  # fmt: skip
    cuts = lhotse.CutSet.from_file("cuts.jsonl.gz")
    train, dev = _records(out / "train.jsonl"), _records(out / "dev.jsonl")
    assert set(train) == set(dev) == {"stereo-a", "stereo-b", "flac-a"}
    assert train == dev  # a cut's supervision counts from the cut's start
    assert train["stereo-a"]["channel"] == 1 and "channel" not in train["stereo-b"]
    assert [train[u]["speaker"] for u in ("stereo-a", "stereo-b", "flac-a")] == ["s1", "s2", "s3"]
    assert (train["stereo-a"]["start"], train["stereo-a"]["duration"]) == (0.25, 1.0)
    assert train["flac-a"]["audio"] == str(corpus / "audio/mono.flac")
    _assert_lhotse_audio(train, cuts)
    # the second channel reaches the features: lhotse's samples, our filterbank
    features.main(
        ["--manifest-dir", str(out), "--out", str(tmp_path / "fbank"), "--splits", "train",
         "--num-mel-bins", "40", "--workers", "0"]
    )  # fmt: skip
    store = FeatureStore(tmp_path / "fbank" / "train")
    cut = next(c for c in cuts if c.supervisions[0].id == "stereo-a")
    expected = compute_fbank(torch.from_numpy(cut.load_audio()[0]), RATE, FbankOptions(40))
    torch.testing.assert_close(store["stereo-a"].float(), expected, atol=2e-2, rtol=1e-2)
    other = store["stereo-b"].float()[: expected.shape[0]]
    assert (other - expected[: other.shape[0]]).abs().mean() > 1.0  # another channel, unlike


def test_relative_sources_need_the_audio_root_elsewhere(corpus, tmp_path, monkeypatch):
    manifests = ["--manifests", f"train={corpus / 'cuts.jsonl.gz'}"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        prepare.main(["lhotse", *manifests, "--out", str(tmp_path / "a")])
    assert exit_info.value.code == 1
    assert "no such audio file (tried" in (tmp_path / "a" / "skipped.tsv").read_text()
    prepare.main(["lhotse", *manifests, "--out", str(tmp_path / "b"), "--audio-root", str(corpus)])
    with pytest.raises(CorpusError, match="--audio-root .*nowhere: no such directory"):
        prepare_lhotse({"train": [corpus / "cuts.jsonl.gz"]}, tmp_path / "c", audio_root="nowhere")
    assert len(_records(tmp_path / "b" / "train.jsonl")) == 3


def test_the_kaldi_directory_lhotse_exports_imports(corpus, tmp_path):
    """lhotse writes a mono WAV recording as its path (relative, as given) and cuts it by
    ``segments``; the other recordings are ffmpeg commands."""
    recordings = lhotse.RecordingSet.from_file("recordings.jsonl.gz")
    mono = lhotse.RecordingSet.from_recordings(r for r in recordings if r.id == "wav")
    extra = lhotse.SupervisionSet.from_segments(
        [
            lhotse.SupervisionSegment("wav-a", "wav", 0.0, 0.75, text="one", speaker="s4"),
            lhotse.SupervisionSegment("wav-b", "wav", 0.75, 1.25, text="two", speaker="s4"),
        ]
    )
    export_to_kaldi(mono, extra, "kaldi", map_underscores_to="-")
    wav_scp = (corpus / "kaldi" / "wav.scp").read_text().split()
    assert wav_scp[1] == "audio/mono.wav"  # relative, resolved against the working directory
    out = tmp_path / "out"
    prepare.main(["kaldi", "--data-dir", "kaldi", "--out", str(out)])
    records = _records(out / "kaldi.jsonl")
    assert len(records) == 2 and all(r["speaker"] == "s4" for r in records.values())
    cuts = lhotse.CutSet.from_manifests(recordings=mono, supervisions=extra).trim_to_supervisions()
    by_start = {round(r["start"], 3): r for r in records.values()}
    for cut in cuts:
        record = by_start[round(cut.start, 3)]
        ours, _ = read_segment(record["audio"], record["start"], record["duration"])
        np.testing.assert_allclose(ours, cut.load_audio()[0], atol=1e-6)


def test_channels_given_as_a_list_and_what_cannot_be_read():
    """A supervision's channel as lhotse may write it, ``[1]``, is that channel; several
    channels, transforms and URLs are reasons, not records."""
    stereo = {"id": "r", "sources": [{"type": "file", "channels": [0, 1], "source": "a.wav"}]}
    assert _source(stereo, [1])[:2] == (stereo["sources"][0], 1)
    assert _source(stereo, 0)[1] == 0
    assert _source(stereo, [0, 1])[2] == "a supervision over channels [0, 1]: one channel is read"
    assert "has no source for channel 2" in _source(stereo, 2)[2]
    resampled = {**stereo, "transforms": [{"name": "Resample"}]}
    assert _source(resampled, 0)[2] == "recording r has audio transforms ['Resample']"
    url = {"id": "u", "sources": [{"type": "url", "channels": [0], "source": "http://x"}]}
    assert _source(url, 0)[2] == "a 'url' audio source cannot be read"
