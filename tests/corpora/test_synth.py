"""The synth corpus writer: manifest contract, gold alignments, determinism, idempotence, bad input."""

import dataclasses
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile

from cbasr.cli.synth import main as synth_main
from cbasr.corpora.synth import corpus as corpus_module
from cbasr.corpora.synth.corpus import MARKER, SIZES, make_corpus
from cbasr.corpora.synth.espeak import EspeakError, Synthesis, espeak_engine
from cbasr.corpora.synth.phones import FULL_PHONES, MERGE_MAP, MERGED_PHONES, UnknownPhoneError
from cbasr.corpora.synth.synthesis import UnusableUtterance, UtterancePlan, render_utterance
from cbasr.corpora.synth.text import vocabulary

TINY = SIZES["tiny"]
SPLITS = ("train", "dev", "test")
KEYS = ["id", "audio", "duration", "speaker", "words", "phones", "phones_full", "phone_starts"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "tiny"
    make_corpus(out, TINY, workers=1)
    return out


def _manifest(corpus: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (corpus / f"{split}.jsonl").read_text().splitlines()]


def _files(corpus: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(corpus)): p.read_bytes() for p in sorted(corpus.rglob("*")) if p.is_file()
    }


def _read_audio(corpus: Path, entry: dict) -> np.ndarray:
    audio, rate = soundfile.read(corpus / entry["audio"], dtype="int16")
    assert rate == 16000
    return audio


def test_manifest_contract(tiny):
    speakers = {s["id"]: s for s in json.loads((tiny / "speakers.json").read_text())}
    assert (tiny / "phones.txt").read_text().split() == list(MERGED_PHONES)
    assert (tiny / "phones_full.txt").read_text().split() == list(FULL_PHONES)
    ids = set()
    for split in SPLITS:
        entries = _manifest(tiny, split)
        assert len(entries) == TINY.speakers(split) * TINY.utts_per_speaker(split)
        for e in entries:
            assert list(e) == KEYS
            assert re.fullmatch(r"spk\d{3}-\d{5}", e["id"]) and e["id"].startswith(
                e["speaker"] + "-"
            )
            assert e["id"] not in ids
            ids.add(e["id"])
            assert speakers[e["speaker"]]["split"] == split
            assert e["audio"] == f"wav/{split}/{e['id']}.wav"
            info = soundfile.info(tiny / e["audio"])
            assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
            assert isinstance(e["duration"], float) and e["duration"] == info.frames / 16000
            assert isinstance(e["words"], str) and e["words"] == " ".join(e["words"].split())
            assert set(e["words"].split()) <= vocabulary()
            assert len(e["phones"]) == len(e["phones_full"]) == len(e["phone_starts"]) > 0
            assert all(isinstance(p, str) for p in e["phones"] + e["phones_full"])
            assert [MERGE_MAP[p] for p in e["phones_full"]] == e["phones"]
            starts = e["phone_starts"]
            assert all(isinstance(t, float) for t in starts)
            assert 0 <= starts[0] and starts[-1] < e["duration"]
            assert all(a <= b for a, b in zip(starts, starts[1:]))


def test_speakers_json_and_disjoint_splits(tiny):
    speakers = json.loads((tiny / "speakers.json").read_text())
    keys = {"id", "split", "voice", "variant", "rate", "pitch", "pitch_range"}
    assert [set(s) for s in speakers] == [keys] * 6
    by_split = {split: {e["speaker"] for e in _manifest(tiny, split)} for split in SPLITS}
    assert not (by_split["train"] & by_split["dev"]) and not (by_split["train"] & by_split["test"])
    assert not (by_split["dev"] & by_split["test"])
    assert len({(s["voice"], s["variant"]) for s in speakers}) == len(speakers)


def _loud_frames(audio: np.ndarray) -> np.ndarray:
    """Indices of 5 ms frames (80 samples at 16 kHz) with RMS above 1% of full scale."""
    frames = audio[: len(audio) // 80 * 80].astype(np.float64).reshape(-1, 80)
    return np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > 327)


def test_phone_starts_follow_the_audio(tiny):
    """First phone at the speech onset, last phone near its end (catches wrong time scales)."""
    for split in SPLITS:
        for e in _manifest(tiny, split):
            loud = _loud_frames(_read_audio(tiny, e))
            onset, offset = loud[0] * 0.005, (loud[-1] + 1) * 0.005
            assert abs(e["phone_starts"][0] - onset) < 0.025, e["id"]
            assert offset - 0.6 < e["phone_starts"][-1] < offset + 0.01, e["id"]


def test_no_phone_starts_inside_pauses():
    engine = espeak_engine()
    engine.reset()
    engine.set_voice("en", "m3")
    engine.set_prosody(160, 50, 50)
    plan = UtterancePlan(
        "spk000-00000", "one seven nine eleven", "one, seven, nine, eleven.", seed=0
    )
    rendered = render_utterance(engine, plan)
    loud = _loud_frames(rendered.audio)
    gaps = [(a, b) for a, b in zip(loud, loud[1:]) if b - a >= 16]  # silences of 80 ms or more
    assert len(gaps) == 3
    for a, b in gaps:
        silence_start, silence_end = (a + 1) * 0.005, b * 0.005
        inside = [t for t in rendered.phone_starts if silence_start + 0.02 < t < silence_end - 0.02]
        assert not inside, (silence_start, silence_end, inside)


def test_same_seed_same_bytes(tiny, tmp_path):
    make_corpus(tmp_path / "again", TINY, workers=1)
    assert _files(tmp_path / "again") == _files(tiny)


def test_workers_do_not_change_the_output(tiny, tmp_path):
    make_corpus(tmp_path / "parallel", TINY, workers=2)
    assert _files(tmp_path / "parallel") == _files(tiny)


def test_other_seed_differs(tiny, tmp_path):
    make_corpus(tmp_path / "other", dataclasses.replace(TINY, seed=1), workers=1)
    other, ours = _files(tmp_path / "other"), _files(tiny)
    for name in ("train.jsonl", "speakers.json", "wav/train/spk000-00000.wav"):
        assert other[name] != ours[name]
    for split in SPLITS:  # the sentences change too, not only the voices
        assert {e["words"] for e in _manifest(tmp_path / "other", split)}.isdisjoint(
            e["words"] for e in _manifest(tiny, split)
        )


def test_rerun_is_a_no_op(tiny, caplog):
    mtimes = {p: p.stat().st_mtime_ns for p in tiny.rglob("*")}
    with caplog.at_level(logging.INFO):
        summary = make_corpus(tiny, TINY, workers=1)
    assert not summary.generated and summary.utterances == {"train": 12, "dev": 2, "test": 2}
    assert "nothing to do" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in tiny.rglob("*")} == mtimes


@pytest.mark.parametrize("damage", ["marker", "wav", "manifest", "parameters"])
def test_incomplete_corpus_regenerates(tmp_path, damage):
    out = tmp_path / "corpus"
    config = dataclasses.replace(TINY, train_utts_per_speaker=4)
    make_corpus(out, config)
    if damage == "marker":
        (out / MARKER).unlink()
    elif damage == "wav":
        (out / "wav/dev/spk004-00001.wav").unlink()
    elif damage == "manifest":
        (out / "test.jsonl").unlink()
    else:
        config = TINY
    summary = make_corpus(out, config)
    assert summary.generated
    params = json.loads((out / MARKER).read_text())["params"]
    assert params["train_utts_per_speaker"] == config.train_utts_per_speaker
    assert (out / "wav/dev/spk004-00001.wav").is_file() and (out / "test.jsonl").is_file()
    expected = {f"wav/{e['split']}/{e['id']}.wav" for e in _all_entries(out)}
    assert {str(p.relative_to(out)) for p in (out / "wav").rglob("*.wav")} == expected
    assert not list(out.rglob("*.partial"))


def _all_entries(corpus: Path) -> list[dict]:
    return [{**e, "split": split} for split in SPLITS for e in _manifest(corpus, split)]


def test_bad_sentences_are_reported_and_skipped(tmp_path, monkeypatch, caplog):
    real_plan = corpus_module.plan_corpus

    def plan_with_bad_sentences(config, corpus_dir):
        jobs = real_plan(config, corpus_dir)
        plans = list(jobs[0].utterances)
        plans[0] = dataclasses.replace(plans[0], words="", text="")
        plans[1] = dataclasses.replace(plans[1], words="...", text="...")  # no phones to speak
        jobs[0] = dataclasses.replace(jobs[0], utterances=tuple(plans))
        return jobs

    monkeypatch.setattr(corpus_module, "plan_corpus", plan_with_bad_sentences)
    with caplog.at_level(logging.INFO):
        summary = make_corpus(tmp_path / "bad", TINY)
    assert summary.skipped == 2 and summary.utterances["train"] == 10
    assert "spk000-00000: empty sentence" in caplog.text
    assert "spk000-00001: eSpeak reported no phone events" in caplog.text
    assert "2 skipped" in caplog.text
    ids = [e["id"] for e in _manifest(tmp_path / "bad", "train")]
    assert "spk000-00000" not in ids and "spk000-00001" not in ids and "spk000-00002" in ids


class _FakeEngine:
    """Returns a fixed synthesis, or fails, instead of running eSpeak."""

    def __init__(
        self, phones=("h", "'aI", "_"), samples=(0, 2000, 22050), length=22050, fail=False
    ):
        self.synthesis = Synthesis(
            np.zeros(length, dtype=np.int16), 22050, tuple(phones), tuple(samples)
        )
        self.fail = fail

    def synthesize(self, text, seed=0):
        if self.fail:
            raise EspeakError("espeak_Synth failed with status -1")
        return self.synthesis


def test_render_utterance_checks():
    plan = UtterancePlan("spk003-00007", "hi", "hi.", seed=0)
    rendered = render_utterance(_FakeEngine(), plan)
    assert rendered.phones == rendered.phones_full == ["h", "aI"]
    assert rendered.phone_starts == [0.0, round(2000 / 22050, 5)]
    assert len(rendered.audio) == 16000 and rendered.duration == 1.0
    with pytest.raises(UnusableUtterance, match="synthesis failed"):
        render_utterance(_FakeEngine(fail=True), plan)
    with pytest.raises(UnusableUtterance, match="no audio"):
        render_utterance(_FakeEngine(length=0), plan)
    with pytest.raises(UnusableUtterance, match="decrease"):
        render_utterance(_FakeEngine(samples=(3000, 2000, 22050)), plan)
    with pytest.raises(UnusableUtterance, match="outside"):
        render_utterance(_FakeEngine(samples=(0, 22050, 22050)), plan)
    with pytest.raises(UnknownPhoneError, match=r"'Q'.*spk003-00007"):
        render_utterance(_FakeEngine(phones=("h", "'Q", "_")), plan)


def test_unknown_phone_stops_generation(tmp_path, monkeypatch):
    monkeypatch.delitem(MERGE_MAP, "D")  # every tiny corpus says "the" somewhere
    with pytest.raises(UnknownPhoneError, match=r"'D' in utterance spk\d{3}-\d{5}"):
        make_corpus(tmp_path / "unknown", TINY)
    assert not (tmp_path / "unknown" / MARKER).exists()


def test_cli_sizes(tmp_path):
    out = tmp_path / "cli"
    synth_main(
        [
            "--out",
            str(out),
            "--size",
            "tiny",
            "--train-speakers",
            "2",
            "--utts-per-speaker",
            "2",
            "--dev-utts-per-speaker",
            "1",
            "--seed",
            "7",
            "--workers",
            "1",
        ]
    )
    assert [len(_manifest(out, split)) for split in SPLITS] == [4, 1, 2]
    params = json.loads((out / MARKER).read_text())["params"]
    assert params["seed"] == 7 and params["train_speakers"] == 2 and params["test_speakers"] == 1
