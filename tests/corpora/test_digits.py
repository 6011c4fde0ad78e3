"""The connected-digits corpus: manifest contract, gold word times, digit statistics,
determinism, idempotence and the command line."""

import dataclasses
import json
import logging
import random
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile

from cbasr.cli.synth import main as synth_main
from cbasr.corpora.synth.digits import (
    DIGIT_WORDS,
    DIGITS_SIZES,
    NOISES,
    DigitsConfig,
    digit_words,
    make_digits_corpus,
    plan_digits,
    repeated_digit_words,
)
from cbasr.corpora.synth.directory import MARKER

TINY = DIGITS_SIZES["tiny"]
SPLITS = ("train", "dev", "test")
KEYS = ["id", "audio", "duration", "speaker", "words", "word_starts", "word_ends"]
KEYS += ["noise", "snr_db", "rt60"]
# gold times and gaps are whole samples at 16 kHz: compare seconds to a tenth of a sample
EPS = 1 / 160000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digits") / "tiny"
    make_digits_corpus(out, TINY, workers=1)
    return out


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    """Neither noise nor reverberation: the gaps are digital silence."""
    out = tmp_path_factory.mktemp("digits") / "clean"
    make_digits_corpus(out, dataclasses.replace(TINY, noise_share=0.0, reverb_share=0.0))
    return out


def _manifest(corpus: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (corpus / f"{split}.jsonl").read_text().splitlines()]


def _entries(corpus: Path) -> list[dict]:
    return [e for split in SPLITS for e in _manifest(corpus, split)]


def _files(corpus: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(corpus)): p.read_bytes() for p in sorted(corpus.rglob("*")) if p.is_file()
    }


def _gaps(entry: dict) -> list[float]:
    """Seconds before each word and after the last."""
    ends = [0.0] + entry["word_ends"]
    starts = entry["word_starts"] + [entry["duration"]]
    return [start - end for start, end in zip(starts, ends)]


def test_manifest_contract(tiny):
    assert (tiny / "words.txt").read_text().split() == list(DIGIT_WORDS)
    speakers = {s["id"]: s for s in json.loads((tiny / "speakers.json").read_text())}
    for split in SPLITS:
        entries = _manifest(tiny, split)
        assert len(entries) == TINY.speakers(split) * TINY.utts_per_speaker(split)
        for e in entries:
            assert list(e) == KEYS
            assert (
                e["id"].startswith(e["speaker"] + "-") and speakers[e["speaker"]]["split"] == split
            )
            assert e["audio"] == f"wav/{split}/{e['id']}.wav"
            info = soundfile.info(tiny / e["audio"])
            assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
            assert e["duration"] == info.frames / 16000
            words = e["words"].split()
            assert e["words"] == " ".join(words) and set(words) <= set(DIGIT_WORDS)
            assert TINY.min_words <= len(words) <= TINY.max_words
            assert len(e["word_starts"]) == len(e["word_ends"]) == len(words)
            assert all(s < t for s, t in zip(e["word_starts"], e["word_ends"]))
            assert all(0.05 - EPS < gap < 0.3 + EPS for gap in _gaps(e)), _gaps(e)
            assert e["noise"] in NOISES and TINY.min_snr_db <= e["snr_db"] <= TINY.max_snr_db
            assert e["rt60"] is None or 0.2 <= e["rt60"] <= 0.7
    train = {e["speaker"] for e in _manifest(tiny, "train")}
    held_out = {e["speaker"] for split in ("dev", "test") for e in _manifest(tiny, split)}
    assert not train & held_out


def _frame_rms(audio: np.ndarray) -> np.ndarray:
    """RMS of each 5 ms frame (80 samples; the last one padded with zeros)."""
    frames = np.zeros(-(-len(audio) // 80) * 80)
    frames[: len(audio)] = audio
    return np.sqrt((frames.reshape(-1, 80) ** 2).mean(axis=1))


def test_word_times_span_the_words(clean):
    """Without noise or room: the gaps are exact silence and every word starts and ends loud."""
    for e in _entries(clean):
        audio, _ = soundfile.read(clean / e["audio"], dtype="int16")
        bounds = [0] + [
            round(t * 16000) for pair in zip(e["word_starts"], e["word_ends"]) for t in pair
        ]
        bounds.append(len(audio))
        for gap_start, gap_end in zip(bounds[::2], bounds[1::2]):
            assert not audio[gap_start:gap_end].any(), (e["id"], gap_start, gap_end)
        for start, end in zip(bounds[1::2], bounds[2::2]):
            rms = _frame_rms(audio[start:end])
            floor = rms.max() * 10 ** (-41 / 20)  # the trim's 40 dB, less int16 rounding
            assert rms[0] >= floor and rms[-1] >= floor, e["id"]


def test_noise_fills_the_gaps(tiny):
    """With noise (every utterance of the default difficulty), no gap is silent."""
    for e in _entries(tiny):
        audio, _ = soundfile.read(tiny / e["audio"], dtype="int16")
        first_gap = audio[: round(e["word_starts"][0] * 16000)]
        assert np.sqrt(np.mean(first_gap.astype(np.float64) ** 2)) > 1.0, e["id"]


def test_words_are_uniform_and_repeat_about_one_in_ten():
    rng = random.Random(0)
    config = DIGITS_SIZES["default"]
    strings = [digit_words(rng, config) for _ in range(20000)]
    lengths = Counter(len(words) for words in strings)
    assert set(lengths) == set(range(2, 8))
    assert all(abs(count / 20000 - 1 / 6) < 0.015 for count in lengths.values())  # 5 sd
    words = Counter(word for s in strings for word in s)
    total = sum(words.values())  # about 90,000
    for word, count in words.items():
        expected = 0.05 if word in ("zero", "oh") else 0.1
        assert abs(count / total - expected) < 5 * np.sqrt(expected * (1 - expected) / total), word
    # P(repeat) = 9 * 0.1^2 + 2 * 0.05^2 = 0.095 per word after the first
    pairs = [(a, b) for s in strings for a, b in zip(s, s[1:])]
    repeats = sum(a == b for a, b in pairs) / len(pairs)  # about 70,000 pairs: sd 0.0011
    assert abs(repeats - 0.095) < 0.0055


def test_default_plan_repeats_and_shares():
    every = plan_digits(DIGITS_SIZES["default"], "/nonexistent")
    jobs = [job for job in every if job.split != "repeats"]
    plans = [plan for job in jobs for plan in job.utterances]
    assert len(plans) == 3600
    assert sum(len(job.utterances) for job in every if job.split == "repeats") == 300
    pairs = [(a.word, b.word) for p in plans for a, b in zip(p.words, p.words[1:])]
    repeats = sum(a == b for a, b in pairs) / len(pairs)  # about 12,600 pairs: sd 0.0026
    assert abs(repeats - 0.095) < 0.013
    noises = Counter(p.noise for p in plans)
    assert set(noises) == set(NOISES) and min(noises.values()) > 1000
    assert 0.45 < sum(p.rt60 is not None for p in plans) / len(plans) < 0.55
    for job in jobs:  # per-word prosody jitter around the speaker's
        rates = {w.rate for p in job.utterances for w in p.words}
        assert len(rates) > 5 and all(abs(r / job.speaker.rate - 1) <= 0.16 for r in rates)
        pitches = {w.pitch for p in job.utterances for w in p.words}
        ranges = {w.pitch_range for p in job.utterances for w in p.words}
        assert len(pitches) > 5 and all(abs(x - job.speaker.pitch) <= 8 for x in pitches)
        assert len(ranges) > 5 and all(abs(x - job.speaker.pitch_range) <= 10 for x in ranges)
    gaps = [gap for p in plans for gap in p.gaps]  # samples at 16 kHz, uniform in 50-300 ms
    assert 50 * 16 <= min(gaps) < 51 * 16 and 299 * 16 < max(gaps) <= 300 * 16
    held_out = [job.speaker for job in jobs if job.split != "train"]
    assert len(held_out) == 40  # 20 dev and 20 test speakers, each with a variant of its own
    assert len({speaker.variant for speaker in held_out}) == 40


def test_same_seed_same_bytes(tiny, tmp_path):
    make_digits_corpus(tmp_path / "again", TINY, workers=1)
    assert _files(tmp_path / "again") == _files(tiny)


def test_workers_do_not_change_the_output(tiny, tmp_path):
    make_digits_corpus(tmp_path / "parallel", TINY, workers=2)
    assert _files(tmp_path / "parallel") == _files(tiny)


def test_other_seed_differs(tiny, tmp_path):
    make_digits_corpus(tmp_path / "other", dataclasses.replace(TINY, seed=1))
    other, ours = _entries(tmp_path / "other"), _entries(tiny)
    assert (tmp_path / "other/speakers.json").read_text() != (tiny / "speakers.json").read_text()
    for key in ("words", "word_starts", "snr_db"):  # the plans change too, not only the voices
        assert [e[key] for e in other] != [e[key] for e in ours]


def test_rerun_is_a_no_op_and_damage_regenerates(tmp_path, caplog):
    out = tmp_path / "corpus"
    make_digits_corpus(out, TINY)
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    with caplog.at_level(logging.INFO):
        summary = make_digits_corpus(out, TINY)
    assert not summary.generated and "nothing to do" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == mtimes
    (out / "wav/dev/spk004-00001.wav").unlink()
    assert make_digits_corpus(out, TINY).generated
    assert (out / "wav/dev/spk004-00001.wav").is_file()
    harder = dataclasses.replace(TINY, min_snr_db=0.0)
    assert make_digits_corpus(out, harder).generated
    assert json.loads((out / MARKER).read_text())["params"]["min_snr_db"] == 0.0
    assert not list(out.rglob("*.partial"))


@pytest.mark.parametrize(
    "change",
    [{"min_words": 0}, {"min_words": 5, "max_words": 4}, {"min_gap_ms": 400}, {"max_snr_db": 0.0}]
    + [{"reverb_share": 1.5}, {"train_speakers": -1}, {"min_repeat_gap_ms": 301}]
    + [{"repeat_prosody": "fresh"}, {"min_words": 1, "max_words": 1}]
    + [{"train_repeats": "few"}],
)
def test_bad_config_is_refused(change):
    with pytest.raises(ValueError):
        dataclasses.replace(DigitsConfig(), **change)


def test_command_line(tmp_path, capsys):
    out = tmp_path / "cli"
    synth_main(
        ["--profile", "digits", "--out", str(out), "--size", "tiny", "--workers", "1"]
        + ["--train-speakers", "2", "--snr-db", "0", "10", "--reverb-share", "0"]
    )
    params = json.loads((out / MARKER).read_text())["params"]
    assert (params["train_speakers"], params["min_snr_db"], params["max_snr_db"]) == (2, 0.0, 10.0)
    assert all(e["rt60"] is None and e["snr_db"] <= 10 for e in _entries(out))
    with pytest.raises(SystemExit) as error:
        synth_main(["--out", str(tmp_path / "sentences"), "--snr-db", "0", "10"])
    assert error.value.code == 2 and "--profile digits" in capsys.readouterr().err
    with pytest.raises(SystemExit) as error:
        synth_main(["--out", str(tmp_path / "sentences"), "--repeat-prosody", "drawn"])
    assert (
        error.value.code == 2
        and "--repeat-prosody need --profile digits" in capsys.readouterr().err
    )


def _repeated_words(jobs, split: str) -> tuple[int, int]:
    """Words of ``split``'s planned utterances that repeat their predecessor, and all words."""
    texts = [
        [w.word for w in plan.words]
        for job in jobs
        if job.split == split
        for plan in job.utterances
    ]
    return sum(a == b for t in texts for a, b in zip(t, t[1:])), sum(map(len, texts))


def test_train_repeats_none_leaves_no_train_word_repeating_its_predecessor(tmp_path):
    """``train_repeats="none"``: no train word repeats the one before it; about one in ten
    does with the default, and in the other splits either way (the repeats split: at least
    one an utterance); the marker records the option only when it is not the default."""
    config = dataclasses.replace(
        TINY, train_speakers=6, train_utts_per_speaker=20, test_utts_per_speaker=40
    )
    natural = plan_digits(config, tmp_path)
    none = plan_digits(dataclasses.replace(config, train_repeats="none"), tmp_path)
    repeated, words = _repeated_words(natural, "train")
    assert 0.05 < repeated / words < 0.15
    assert _repeated_words(none, "train")[0] == 0 and _repeated_words(none, "train")[1] > 400
    assert _repeated_words(none, "test")[0] > 0
    assert _repeated_words(none, "repeats")[0] >= 2  # TINY: 2 utterances
    old, new = random.Random(3), random.Random(3)  # the default draws as before the option
    for _ in range(50):
        words = []
        for _ in range(old.randint(config.min_words, config.max_words)):
            digit = old.randrange(10)
            words.append(DIGIT_WORDS[digit] if digit or old.random() < 0.5 else "oh")
        assert digit_words(new, config) == words
    out = tmp_path / "none"
    make_digits_corpus(out, dataclasses.replace(TINY, train_repeats="none"), workers=1)
    assert json.loads((out / MARKER).read_text())["params"]["train_repeats"] == "none"
    make_digits_corpus(tmp_path / "natural", TINY, workers=1)
    assert "train_repeats" not in json.loads((tmp_path / "natural" / MARKER).read_text())["params"]


def test_command_line_repeats_split_options(tmp_path):
    out = tmp_path / "cli"
    synth_main(
        ["--profile", "digits", "--out", str(out), "--size", "tiny", "--workers", "1"]
        + ["--train-speakers", "1", "--repeats-utts-per-speaker", "3"]
        + ["--repeat-prosody", "drawn", "--repeat-gap-ms", "60", "70", "--train-repeats", "none"]
    )
    params = json.loads((out / MARKER).read_text())["params"]
    assert params["repeat_prosody"] == "drawn" and params["train_repeats"] == "none"
    assert (params["min_repeat_gap_ms"], params["max_repeat_gap_ms"]) == (60, 70)
    repeats = _manifest(out, "repeats")
    assert len(repeats) == 3
    for e in repeats:
        words, gaps = e["words"].split(), _gaps(e)
        for i in range(1, len(words)):
            if words[i] == words[i - 1]:
                assert 0.06 - EPS < gaps[i] < 0.07 + EPS


# The repeats split: a stress test of repeated digits.


def test_repeats_split_contract(tiny):
    """The test speakers again, each utterance with a repeat, ids and audio of its own."""
    test = _manifest(tiny, "test")
    repeats = _manifest(tiny, "repeats")
    assert len(repeats) == TINY.test_speakers * TINY.repeats_utts_per_speaker
    assert {e["speaker"] for e in repeats} == {e["speaker"] for e in test}
    assert not {e["id"] for e in repeats} & {e["id"] for e in _entries(tiny)}
    speakers = json.loads((tiny / "speakers.json").read_text())
    assert sorted(s["split"] for s in speakers) == sorted(
        ["train"] * TINY.train_speakers
        + ["dev"] * TINY.dev_speakers
        + ["test"] * TINY.test_speakers
    )
    for e in repeats:
        assert list(e) == KEYS and e["audio"] == f"wav/repeats/{e['id']}.wav"
        assert e["id"].startswith(e["speaker"] + "-r")
        words = e["words"].split()
        assert any(a == b for a, b in zip(words, words[1:])), e["words"]
        assert soundfile.info(tiny / e["audio"]).frames / 16000 == e["duration"]


def test_adding_the_repeats_split_leaves_the_others_as_they_were():
    """It is drawn last: the corpora of earlier results keep their train, dev and test."""
    without = plan_digits(dataclasses.replace(TINY, repeats_utts_per_speaker=0), "/x")
    with_repeats = plan_digits(TINY, "/x")
    assert [job for job in with_repeats if job.split != "repeats"] == [
        job for job in without if job.split != "repeats"
    ]
    assert [len(job.utterances) for job in with_repeats if job.split == "repeats"] == [2]
    assert [len(job.utterances) for job in without if job.split == "repeats"] == [0]


def test_repeated_digit_words_force_one_uniform_repeat():
    rng = random.Random(0)
    config = DIGITS_SIZES["default"]
    strings = [repeated_digit_words(rng, config) for _ in range(20000)]
    assert all(any(a == b for a, b in zip(s, s[1:])) for s in strings)
    lengths = Counter(len(s) for s in strings)
    assert set(lengths) == set(range(2, 8))
    # one forced repeat per string, and 0.095 of the other pairs repeat by chance:
    # E[repeats] = 1 + 0.095 * E[len - 2] = 1 + 0.095 * 2.5 = 1.2375 (sd of the mean 0.004)
    repeats = [sum(a == b for a, b in zip(s, s[1:])) for s in strings]
    assert abs(statistics.mean(repeats) - 1.2375) < 0.02
    # the forced position is uniform: in two-word strings the repeat is the whole string
    assert all(s[0] == s[1] for s in strings if len(s) == 2)
    first = sum(s[1] == s[0] for s in strings if len(s) == 7) / lengths[7]
    assert abs(first - (1 / 6 + 5 / 6 * 0.095)) < 0.03  # 3333 strings: sd 0.0066


def _word_audio(corpus: Path, entry: dict) -> list[np.ndarray]:
    audio, _ = soundfile.read(corpus / entry["audio"], dtype="int16")
    return [
        audio[round(s * 16000) : round(t * 16000)]
        for s, t in zip(entry["word_starts"], entry["word_ends"])
    ]


@pytest.fixture(scope="module")
def clean_repeats(tmp_path_factory) -> dict[str, Path]:
    """Dry repeats splits (no noise, no room, one peak level) said the same or anew."""
    corpora = {}
    for prosody in ("same", "drawn"):
        out = tmp_path_factory.mktemp("digits") / prosody
        config = dataclasses.replace(
            TINY, noise_share=0.0, reverb_share=0.0, repeats_utts_per_speaker=4,
            repeat_prosody=prosody, min_repeat_gap_ms=50, max_repeat_gap_ms=60,
            train_speakers=1, train_utts_per_speaker=1,
        )  # fmt: skip
        make_digits_corpus(out, config)
        corpora[prosody] = out
    return corpora


def test_a_repeat_is_its_predecessor_said_again(clean_repeats):
    """What makes the split's repeats hard: the same samples as the word before, after a
    gap of the repeat's range; with repeat_prosody="drawn" the two takes differ."""
    pairs, others = {}, []
    for prosody, corpus in clean_repeats.items():
        pairs[prosody] = []
        for e in _manifest(corpus, "repeats"):
            words, audio, gaps = e["words"].split(), _word_audio(corpus, e), _gaps(e)
            for i in range(1, len(words)):
                if words[i] == words[i - 1]:
                    assert 0.05 - EPS < gaps[i] < 0.06 + EPS, (e["id"], gaps[i])
                    pairs[prosody].append((audio[i - 1], audio[i]))
                else:
                    others.append(gaps[i])
    assert len(pairs["same"]) >= 4 and len(pairs["drawn"]) >= 4
    assert max(others) > 0.06  # the other gaps keep the 50-300 ms range
    assert all(np.array_equal(a, b) for a, b in pairs["same"])
    assert not any(len(a) == len(b) and np.array_equal(a, b) for a, b in pairs["drawn"])
