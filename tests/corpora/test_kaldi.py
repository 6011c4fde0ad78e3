"""Kaldi data directories: import (files, segments, commands), counted skips, then training."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from cbasr.cli import features, prepare, vocab
from cbasr.corpora.kaldi import prepare_kaldi, read_table, recording_path
from cbasr.corpora.prepare import CorpusError, DurationFilter
from cbasr.data.audio import AudioError
from cbasr.data.features import FeatureStore
from cbasr.training.asr_task import train
from tests import commands
from tests.corpora.fake_speechocean762 import make_fake_speechocean762
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
    utt2spk.append("beyond dev-x\n")
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


def test_any_whitespace_separates_a_key_from_its_value(tmp_path):
    path = tmp_path / "text"
    path.write_text("u1\tWE  CALL IT\n\nu2 \t A BEAR \nu3\n")
    assert read_table(path) == {"u1": ["WE  CALL IT"], "u2": ["A BEAR"], "u3": [""]}
    path.write_text("u1\trec1 0.0\t1.5\nu2  rec1  1.5 -1\n")
    assert read_table(path, 3) == {"u1": ["rec1", "0.0", "1.5"], "u2": ["rec1", "1.5", "-1"]}
    path.write_text("u1 rec1 0.0\n")
    with pytest.raises(CorpusError, match=r"text:1: expected a key and 3 fields"):
        read_table(path, 3)
    path.write_text("u1 a\nu2 b\nu1\tc\n")
    with pytest.raises(CorpusError, match=r"text:3: duplicate key 'u1'"):
        read_table(path)


@pytest.fixture()
def published(tmp_path):
    """A corpus whose Kaldi directories are as published: tabs, paths relative to its root."""
    root = tmp_path / "corpus"
    make_fake_speechocean762(root)
    return root


def test_published_directories_import_from_the_corpus_root(published, tmp_path, monkeypatch):
    """Run where Kaldi's scripts run (the paths are relative to it), every utterance imports;
    run elsewhere, the split fails with the places tried and the fix, exit 1; --audio-root
    mends it from anywhere."""
    monkeypatch.chdir(published)
    prepare.main(["kaldi", "--data-dir", "train", "test", "--out", str(tmp_path / "a")])
    summary = json.loads((tmp_path / "a" / ".done").read_text())
    assert summary["utterances"] == {"train": 16, "test": 6} and summary["skipped"] == 0
    first = _manifest(tmp_path / "a" / "train.jsonl")[0]
    assert first["id"] == "000010000" and first["words"] == "A BEAR"
    assert first["audio"] == str(published / "WAVE/SPEAKER0001/000010000.WAV")
    assert (first["speaker"], first["age"], first["gender"]) == ("0001", "6", "m")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    dirs = [str(published / "train"), str(published / "test")]
    with pytest.raises(SystemExit) as exit_info:
        prepare.main(["kaldi", "--data-dir", *dirs, "--out", str(tmp_path / "b")])
    assert exit_info.value.code == 1
    assert not (tmp_path / "b" / ".done").exists()
    reasons = (tmp_path / "b" / "skipped.tsv").read_text().splitlines()
    assert len(reasons) == 16 + 6
    assert f"tried {elsewhere / 'WAVE/SPEAKER0001/000010000.WAV'}" in reasons[0]
    assert "relative to the working directory" in reasons[0]
    assert f"pass --audio-root {published}" in reasons[0]
    wrong = ["--audio-root", str(published / "WAVE")]
    with pytest.raises(SystemExit):
        prepare.main(["kaldi", "--data-dir", *dirs, "--out", str(tmp_path / "w"), *wrong])
    reason = (tmp_path / "w" / "skipped.tsv").read_text().splitlines()[0]
    assert (
        f"tried {published / 'WAVE/WAVE/SPEAKER0001/000010000.WAV'}, relative to --audio-root"
        in reason
    )
    prepare.main(
        ["kaldi", "--data-dir", *dirs, "--out", str(tmp_path / "c"), "--audio-root", str(published)]
    )
    assert _manifest(tmp_path / "c" / "train.jsonl") == _manifest(tmp_path / "a" / "train.jsonl")


def test_an_empty_split_fails_in_one_line_naming_the_commonest_reason(published, tmp_path):
    """As a user runs it, from a directory the relative paths do not resolve against."""
    out = commands.run(
        [sys.executable, "-m", "cbasr.cli.prepare", "kaldi", "--data-dir", str(published / "test"),
         "--out", str(tmp_path / "o")],
        cwd=tmp_path, timeout=120,
        env={**os.environ, "CBASR_DEBUG": "0"},
    )  # fmt: skip
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "split test: no usable utterance, 6 skipped; the most common reason (6 of 6)" in lines[0]
    assert "e.g. 000030000: WAVE/SPEAKER0003/000030000.WAV: no such audio file" in lines[0]


def test_entries_neither_a_path_nor_a_command_are_refused(tmp_path):
    for entry in ("/data/feats.ark:1234", "sox a.wav -t wav -"):
        with pytest.raises(CorpusError, match=r"wav.scp: recording r1: .* is neither a file path"):
            recording_path("r1", entry, tmp_path / "wav.scp", tmp_path / "audio", True)
    with pytest.raises(AudioError, match=r"^/nowhere/a.wav: no such audio file$"):
        recording_path("r1", "/nowhere/a.wav", tmp_path / "wav.scp", tmp_path / "audio", True)
    up = str(Path("b", "..", "a.wav"))  # named resolved: a.wav
    with pytest.raises(AudioError, match=f"tried {tmp_path / 'a.wav'}, relative to --audio-root"):
        recording_path("r1", up, tmp_path / "wav.scp", tmp_path, False, tmp_path)


def _write(directory, **tables):
    directory.mkdir(parents=True, exist_ok=True)
    for name, lines in tables.items():
        (directory / name.replace("_", ".", 1 if name == "wav_scp" else 0)).write_text(
            "".join(f"{line}\n" for line in lines)
        )


def test_validate_data_dir_checks_are_named_skips_warnings_or_errors(tone_data, tmp_path):
    """Kaldi's utils/validate_data_dir.sh checks: coverage of text, wav.scp and utt2spk as
    counted skips, the sort order as a warning, spk2utt against utt2spk as an error."""
    corpus = tone_data / "corpus"
    records = _manifest(corpus / "train.jsonl")[:4]
    ids = [r["id"] for r in records]
    d = tmp_path / "d"
    _write(
        d,
        wav_scp=[f"{i} {corpus / r['audio']}" for i, r in zip(ids[:3], records)] + ["zz /x.wav"],
        text=["only-text a"] + [f"{i} a b" for i in ids[1:]],
        utt2spk=[f"{ids[0]} s", f"{ids[1]} s", f"{ids[3]} s", "only-spk s", "zz s"],
        spk2utt=[f"s {ids[0]} {ids[1]} {ids[3]} only-spk zz"],
    )
    (d / "utt2spk").write_text("".join(f"{line}\n" for line in reversed(
        (d / "utt2spk").read_text().splitlines())))  # fmt: skip
    summary = prepare_kaldi([d], tmp_path / "out")
    assert [r["id"] for r in _manifest(tmp_path / "out" / "d.jsonl")] == [ids[1]]
    skipped = {
        line.split("\t")[1]: line.split("\t")[2]
        for line in (tmp_path / "out" / "skipped.tsv").read_text().splitlines()
    }
    assert skipped == {
        ids[0]: "in wav.scp but not in text",
        ids[2]: "not in utt2spk",
        ids[3]: "in text but not in wav.scp",
        "only-text": "in text but not in wav.scp",
        "only-spk": "in utt2spk only but not in wav.scp",
        "zz": "in wav.scp but not in text",
    }
    assert summary["warnings"] == [
        f"{d / 'utt2spk'}: 3 keys out of sorted order (LC_ALL=C sort), the first 'only-spk' "
        "after 'zz'; imported as they are"
    ]
    (d / "spk2utt").write_text(f"s {ids[0]} {ids[1]} {ids[2]} only-spk zz\n")
    with pytest.raises(CorpusError, match=r"spk2utt disagrees with utt2spk for speaker 's': "):
        prepare_kaldi([d], tmp_path / "out2")
    (d / "spk2utt").write_text(f"s {ids[0]} {ids[1]} {ids[3]} only-spk zz\n")
    (d / "text").write_text(f"{ids[1]} a\n{ids[1]}\tb\n")
    with pytest.raises(CorpusError, match=r"text:2: duplicate key"):
        prepare_kaldi([d], tmp_path / "out3")
