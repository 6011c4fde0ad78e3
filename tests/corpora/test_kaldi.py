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
from cbasr.training.asr_task import train
from tests.training.test_trainer import make_cfg


def _same_dev_features(manifest_dir, out, tone_data, *splits) -> FeatureStore:
    """Features of the imported ``splits``; the dev utterances' are the tone corpus's
    originals, bit for bit (a segment read from a longer recording is the utterance)."""
    features.main(
        ["--manifest-dir", str(manifest_dir), "--out", str(out), "--splits", *splits,
         "--num-mel-bins", "40", "--workers", "0"]
    )  # fmt: skip
    ours, theirs = FeatureStore(out / "dev"), FeatureStore(tone_data / "fbank/dev")
    for utt in theirs.index:
        assert torch.equal(ours[utt], theirs[utt]), utt
    return ours


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
    assert len(_same_dev_features(out, tmp_path / "fbank", tone_data, "train", "dev")) == 16
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


def _write_jsonl_gz(path, records):
    import gzip

    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_lhotse_cuts_and_recording_supervision_pairs(tone_data, kaldi_dirs, tmp_path):
    corpus = tone_data / "corpus"
    train = _manifest(corpus / "train.jsonl")[:20]

    def recording(rec_id, path, duration, sources=None):
        return {
            "id": rec_id,
            "sources": sources or [{"type": "file", "channels": [0], "source": str(path)}],
            "sampling_rate": 16000,
            "num_samples": int(duration * 16000),
            "duration": duration,
            "channel_ids": [0],
        }

    cuts = []
    for r in train:  # a cut per file, starting 0.05 s in; its supervision counts from there
        sup = {
            "id": r["id"],
            "recording_id": r["id"],
            "start": 0.0,
            "duration": r["duration"] - 0.05,
            "channel": 0,
            "text": r["words"],
            "speaker": r["speaker"],
        }
        cuts.append(
            {
                "id": f"cut-{r['id']}",
                "start": 0.05,
                "duration": r["duration"] - 0.05,
                "channel": 0,
                "supervisions": [sup],
                "recording": recording(r["id"], corpus / r["audio"], r["duration"]),
                "type": "MonoCut",
            }
        )
    cuts[0]["supervisions"][0]["text"] = " "
    cuts[1]["recording"]["sources"] = [{"type": "url", "channels": [0], "source": "http://x"}]
    _write_jsonl_gz(tmp_path / "cuts_train.jsonl.gz", cuts)
    dev = _manifest(corpus / "dev.jsonl")
    recordings, supervisions = [], []
    for n in range(0, len(dev), 2):
        path = kaldi_dirs / "audio" / f"rec{n // 2}.wav"
        first = soundfile.info(corpus / dev[n]["audio"]).duration
        total = soundfile.info(path).duration
        recordings.append(recording(f"rec{n // 2}", path, total))
        for r, start, length in ((dev[n], 0.0, first), (dev[n + 1], first, total - first)):
            supervisions.append(
                {
                    "id": r["id"],
                    "recording_id": f"rec{n // 2}",
                    "start": start,
                    "duration": length,
                    "channel": 0,
                    "text": r["words"],
                    "speaker": r["speaker"],
                }
            )
    supervisions.append(
        {
            "id": "beyond",
            "recording_id": "rec0",
            "start": 0.5,
            "duration": 60.0,
            "channel": 0,
            "text": "a",
        }
    )
    _write_jsonl_gz(tmp_path / "recordings_dev.jsonl.gz", recordings)
    (tmp_path / "supervisions_dev.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in supervisions)
    )
    out = tmp_path / "out"
    prepare.main(
        [
            "lhotse",
            "--manifests",
            f"train={tmp_path / 'cuts_train.jsonl.gz'}",
            f"dev={tmp_path / 'recordings_dev.jsonl.gz'}",
            f"dev={tmp_path / 'supervisions_dev.jsonl'}",
            "--out",
            str(out),
        ]
    )
    kept = _manifest(out / "train.jsonl")
    assert len(kept) == 18 and all(r["start"] == 0.05 for r in kept)
    skipped = (out / "skipped.tsv").read_text()
    assert "empty text" in skipped and "'url' audio source" in skipped
    assert "beyond recording rec0" in skipped and len(skipped.splitlines()) == 3
    _same_dev_features(out, tmp_path / "fbank", tone_data, "dev")
