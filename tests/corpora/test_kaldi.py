"""Kaldi data directories: import (files, segments, commands), counted skips, then training."""

import json
import shutil

import numpy as np
import pytest
import soundfile
import torch

from cbasr.cli import features, prepare, vocab
from cbasr.corpora.kaldi import prepare_kaldi
from cbasr.corpora.prepare import CorpusError, DurationFilter
from cbasr.data.features import FeatureStore
from cbasr.engines.trainer import train
from tests.engines.test_trainer import make_cfg


def _manifest(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def kaldi_dirs(tone_data, tmp_path_factory):
    """``train``: one file per utterance (the tone corpus), plus an empty transcript and a
    missing file. ``dev``: pairs of dev utterances joined into recordings cut by ``segments``,
    one recording through a command, plus a segment beyond its recording."""
    root = tmp_path_factory.mktemp("kaldi")
    corpus = tone_data / "corpus"
    train_dir, dev_dir = root / "train", root / "dev"
    train_dir.mkdir()
    dev_dir.mkdir()
    records = _manifest(corpus / "train.jsonl")
    (train_dir / "wav.scp").write_text(
        "".join(f"{r['id']} {corpus / r['audio']}\n" for r in records)
        + "gone-0001 /nowhere/gone.wav\nblank-0001 "
        + str(corpus / records[0]["audio"])
        + "\n"
    )
    (train_dir / "text").write_text(
        "".join(f"{r['id']} {r['words']}\n" for r in records) + "gone-0001 a b\nblank-0001   \n"
    )
    (train_dir / "utt2spk").write_text(
        "".join(f"{r['id']} {r['speaker']}\n" for r in records) + "gone-0001 x\nblank-0001 x\n"
    )
    dev = _manifest(corpus / "dev.jsonl")
    wav_scp, segments, text, utt2spk = [], [], [], []
    for n in range(0, len(dev), 2):
        first, second = dev[n], dev[n + 1]
        a, rate = soundfile.read(corpus / first["audio"], dtype="int16")
        b, _ = soundfile.read(corpus / second["audio"], dtype="int16")
        rec = f"rec{n // 2}"
        path = root / "audio" / f"{rec}.wav"
        path.parent.mkdir(exist_ok=True)
        soundfile.write(path, np.concatenate([a, b]), rate, subtype="PCM_16")
        entry = f"cat {path} |" if n == 0 else str(path)
        wav_scp.append(f"{rec} {entry}\n")
        segments.append(f"{first['id']} {rec} 0 {len(a) / rate}\n")
        segments.append(f"{second['id']} {rec} {len(a) / rate} -1\n")
        for r in (first, second):
            text.append(f"{r['id']} {r['words']}\n")
            utt2spk.append(f"{r['id']} {r['speaker']}\n")
    segments.append("beyond rec1 0.5 99.0\n")
    text.append("beyond a b\n")
    for name, lines in (("wav.scp", wav_scp), ("segments", segments), ("text", text)):
        (dev_dir / name).write_text("".join(lines))
    (dev_dir / "utt2spk").write_text("".join(utt2spk))
    return root


def test_a_command_in_wav_scp_is_refused_unless_asked_for(kaldi_dirs, tmp_path):
    with pytest.raises(CorpusError, match="recording rec0 is a command .*--run-pipes"):
        prepare_kaldi([kaldi_dirs / "dev"], tmp_path / "out")


def test_import_counts_every_skip_and_cuts_segments_exactly(tone_data, kaldi_dirs, tmp_path):
    out = tmp_path / "manifests"
    prepare.main(
        [
            "kaldi",
            "--data-dir",
            str(kaldi_dirs / "train"),
            str(kaldi_dirs / "dev"),
            "--out-dir",
            str(out),
            "--run-pipes",
        ]
    )
    train_records, dev_records = _manifest(out / "train.jsonl"), _manifest(out / "dev.jsonl")
    assert len(train_records) == 160 and len(dev_records) == 16
    skipped = {line.split("\t")[1]: line for line in (out / "skipped.tsv").read_text().splitlines()}
    assert set(skipped) == {"gone-0001", "blank-0001", "beyond"}
    assert "empty transcript" in skipped["blank-0001"] and "gone.wav" in skipped["gone-0001"]
    assert "outside recording rec1" in skipped["beyond"]
    assert (out / "audio/dev/rec0.wav").is_file()  # the command's output, stored
    assert all("start" in r for r in dev_records) and dev_records[1]["speaker"].startswith("dev")
    # each segment's features are the original utterance's, bit for bit
    features.main(
        [
            "--manifest-dir",
            str(out),
            "--out",
            str(tmp_path / "fbank"),
            "--splits",
            "train",
            "dev",
            "--num-mel-bins",
            "40",
            "--workers",
            "0",
        ]
    )
    ours, theirs = FeatureStore(tmp_path / "fbank/dev"), FeatureStore(tone_data / "fbank/dev")
    assert len(ours) == 16
    for utt in theirs.index:
        assert torch.equal(ours[utt], theirs[utt]), utt
    # and a model trains on the import (word units: the transcripts)
    vocab.main(
        [
            "--manifest",
            str(out / "train.jsonl"),
            "--units",
            "words",
            "--out",
            str(tmp_path / "lang/words.txt"),
        ]
    )
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus").symlink_to(out)
    (data / "fbank").symlink_to(tmp_path / "fbank")
    (data / "lang").symlink_to(tmp_path / "lang")
    shutil.copy(tmp_path / "lang/words.txt", tmp_path / "lang/phones.txt")
    t = train(
        make_cfg(data, tmp_path / "exp", "trainer.max_epochs=1", "data.units=words"),
        tmp_path / "exp",
    )
    assert t.state.step > 0 and np.isfinite(t.state.history[0]["valid_loss"])


def test_duration_limits_are_counted_skips(kaldi_dirs, tmp_path):
    out = tmp_path / "short"
    summary = prepare_kaldi([kaldi_dirs / "train"], out, durations=DurationFilter(0.0, 0.5))
    kept = _manifest(out / "train.jsonl")
    assert kept and all(r["duration"] <= 0.5 for r in kept)
    reasons = (out / "skipped.tsv").read_text()
    assert summary["skipped"] == 160 - len(kept) + 2
    assert reasons.count("above --max-duration 0.5") == 160 - len(kept)
    with pytest.raises(ValueError, match="need 0 <= min < max"):
        DurationFilter(2.0, 1.0)
