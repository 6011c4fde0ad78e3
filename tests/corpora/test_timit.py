"""TIMIT preparation on a fake tree shaped like the real one."""

import json
import logging

import pytest

from cbasr.corpora import timit
from cbasr.corpora.prepare import CorpusError
from cbasr.corpora.timit import MAP_TO_39, PHONES_48, PHONES_61, map_phones, prepare_timit
from tests.corpora.fake_timit import make_fake_timit


def _manifest(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("upper", [True, False])
def test_splits_exclusions_and_phone_mapping(tmp_path, upper, caplog):
    corpus = make_fake_timit(tmp_path / "corpus", upper=upper)
    with caplog.at_level(logging.WARNING):
        summary = prepare_timit(corpus.parent, tmp_path / "out", "48", strict=False)
    train, dev, test = (
        _manifest(tmp_path / "out" / f"{s}.jsonl") for s in ("train", "dev", "test")
    )
    # SA sentences out, converted .WAV.wav copies not counted, mbwp0 in no split, the truncated
    # mrjm0 sx158 skipped by path with a count.
    assert [r["id"] for r in train] == [
        "fcjf0_si1027",
        "fcjf0_si1657",
        "fcjf0_sx127",
        "fcjf0_sx37",
        "mrjm0_si1095",
        "mrjm0_si1228",
        "mrjm0_sx68",
    ]
    assert [r["id"] for r in dev] == ["faks0_si943", "faks0_sx133", "faks0_sx43"]
    assert [r["id"] for r in test] == [
        "fpkt0_si1538",
        "fpkt0_sx8",
        "mdab0_si1039",
        "mdab0_si1669",
        "mdab0_sx139",
        "mdab0_sx49",
    ]
    assert summary["utterances"] == {"train": 7, "dev": 3, "test": 6} and summary["skipped"] == 1
    skipped = (tmp_path / "out" / "skipped.tsv").read_text().split("\t")
    assert (
        skipped[:2] == ["train", "mrjm0_sx158"]
        and "truncated" in skipped[2]
        and "SX158.WAV" in skipped[2].upper()
    )
    assert "skipped 1 utterances" in caplog.text

    utt = train[0]  # fcjf0 si1027: the sentence rotated by 1
    assert utt["phones_61"][0] == "h#" and utt["phones_61"][-1] == "h#" and "q" in utt["phones_61"]
    expected48 = [
        {"h#": "sil", "hv": "hh", "dcl": "vcl", "axr": "er", "pau": "sil", "tcl": "cl"}.get(p, p)
        for p in utt["phones_61"]
        if p != "q"
    ]
    assert utt["phones"] == expected48
    assert utt["phones_39"] == [
        {"ix": "ih", "vcl": "sil", "ao": "aa", "cl": "sil"}.get(p, p) for p in expected48
    ]
    assert len(utt["phone_starts"]) == len(utt["phones"]) and utt["phone_starts"][0] == 0.0
    assert utt["phone_starts"] == sorted(utt["phone_starts"])
    assert utt["speaker"] == "fcjf0"
    assert set(utt["words"].split()) == {"she", "had", "your", "dark"}
    assert utt["duration"] > 0 and utt["audio"].lower().endswith("si1027.wav")
    lines = (tmp_path / "out" / "map_39.txt").read_text().splitlines()
    assert len(lines) == 48 and "vcl\tsil" in lines and "ix\tih" in lines


def test_the_61_phone_set_keeps_every_label(tmp_path):
    corpus = make_fake_timit(tmp_path / "corpus", truncate=None)
    prepare_timit(corpus, tmp_path / "out", "61", strict=False)
    utt = _manifest(tmp_path / "out" / "train.jsonl")[0]
    assert utt["phones"] == utt["phones_61"]
    lines = (tmp_path / "out" / "map_39.txt").read_text().splitlines()
    assert len(lines) == 61 and "q\t" in lines and "h#\tsil" in lines


def test_the_standard_maps():
    assert len(PHONES_61) == 61 and len(PHONES_48) == 48
    assert len({v for v in MAP_TO_39.values() if v}) == 39
    assert MAP_TO_39["q"] is None and MAP_TO_39["ax-h"] == "ah" and MAP_TO_39["zh"] == "sh"
    assert MAP_TO_39["epi"] == "sil" and MAP_TO_39["en"] == "n" and MAP_TO_39["ux"] == "uw"
    assert [p for _, p in map_phones(["q", "el", "eng"], "48")] == ["el", "ng"]


def test_audio_of_both_byte_orders_reads_the_same_samples(tmp_path):
    from cbasr.data.audio import read_audio

    corpus = make_fake_timit(tmp_path / "corpus", truncate=None)
    folder = corpus / "TRAIN" / "DR1" / "FCJF0"
    little, rate = read_audio(folder / "SI1027.WAV")  # utterance 2 of the speaker: little-endian
    big, _ = read_audio(folder / "SI1657.WAV")  # utterance 3: big-endian
    header = (folder / "SI1657.WAV").read_bytes()[:1024].decode()
    assert "sample_byte_format -s2 10" in header and rate == 16000
    assert abs(little).max() > 0.2 and abs(big).max() > 0.2  # real audio, not byte-swapped noise
    assert abs(big).max() < 0.35


def test_rerun_does_nothing_and_an_interrupted_run_is_redone(tmp_path):
    corpus = make_fake_timit(tmp_path / "corpus")
    out = tmp_path / "out"
    prepare_timit(corpus, out, "48", strict=False)
    stamp = (out / "train.jsonl").stat().st_mtime_ns
    prepare_timit(corpus, out, "48", strict=False)
    assert (out / "train.jsonl").stat().st_mtime_ns == stamp
    (out / "dev.jsonl").write_text("")  # a damaged output
    prepare_timit(corpus, out, "48", strict=False)
    assert len((out / "dev.jsonl").read_text().splitlines()) == 3
    prepare_timit(corpus, out, "61", strict=False)  # other options: redone
    assert len((out / "phones.txt").read_text().splitlines()) == 61


def test_not_timit_or_not_all_of_it_says_what_was_expected(tmp_path):
    (tmp_path / "wsj").mkdir()
    with pytest.raises(CorpusError, match=r"expected TRAIN/ and TEST/.*found \['wsj'\]"):
        prepare_timit(tmp_path, tmp_path / "out")
    corpus = make_fake_timit(tmp_path / "corpus")
    with pytest.raises(
        CorpusError,
        match=r"expected the complete release; found train: 7 usable SI/SX utterances of 2 "
        r"speakers \(expected 3696 of 462\); dev: .*; TEST/: 13 utterance files of 4 speakers "
        r"\(expected 1680 of 168\) \(1 skipped",
    ):
        prepare_timit(corpus, tmp_path / "out")
    with pytest.raises(ValueError, match="phone_set"):
        prepare_timit(corpus, tmp_path / "out", "39")


def test_cli_exits_with_the_message(tmp_path, capsys):
    from cbasr.cli import prepare

    with pytest.raises(SystemExit) as exit_:
        prepare.main(["timit", "--corpus-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    corpus = make_fake_timit(tmp_path / "corpus")
    prepare.main(
        [
            "timit",
            "--corpus-dir",
            str(corpus),
            "--out",
            str(tmp_path / "out"),
            "--allow-partial",
            "--phone-set",
            "61",
        ]
    )
    assert len((tmp_path / "out" / "phones.txt").read_text().splitlines()) == 61
    assert timit.EXPECTED["test"] == 192


def test_riff_wav_files_are_read_and_empty_phn_files_skipped(tmp_path):
    """Copies converted in place (RIFF inside .WAV) give the same utterances and durations; an
    empty .PHN is a counted skip; strict counts compare what was kept."""
    import soundfile

    from cbasr.data.audio import read_audio

    corpus = make_fake_timit(tmp_path / "corpus", truncate=None)
    prepare_timit(corpus.parent, tmp_path / "sphere", "48", strict=False)
    for wav in [p for p in corpus.rglob("*") if p.suffix == ".WAV" and p.name.count(".") == 1]:
        samples, rate = read_audio(wav)
        soundfile.write(wav, samples, rate, subtype="PCM_16", format="WAV")
    phn = next(p for p in corpus.rglob("SX127.PHN"))
    phn.write_text("")
    summary = prepare_timit(corpus.parent, tmp_path / "riff", "48", strict=False)
    sphere = {
        r["id"]: r
        for s in ("train", "dev", "test")
        for r in _manifest(tmp_path / "sphere" / f"{s}.jsonl")
    }
    riff = {
        r["id"]: r
        for s in ("train", "dev", "test")
        for r in _manifest(tmp_path / "riff" / f"{s}.jsonl")
    }
    assert set(sphere) - set(riff) == {"fcjf0_sx127"} and summary["skipped"] == 1
    assert all(riff[u]["duration"] == sphere[u]["duration"] for u in riff)
    assert "an empty transcription" in (tmp_path / "riff" / "skipped.tsv").read_text()


def test_txt_transcriptions_lose_their_punctuation(tmp_path):
    path = tmp_path / "SX1.TXT"
    path.write_text(
        '0 46797 She had your dark suit in greasy wash-water, all year. "Don\'t ask!"\n'
    )
    assert timit._txt_words(path) == (
        "she had your dark suit in greasy wash-water all year don't ask".split()
    )


def _counts(out):
    """``{split: (utterances, speakers)}`` of prepared manifests."""
    counts = {}
    for split in ("train", "dev", "test"):
        records = _manifest(out / f"{split}.jsonl")
        counts[split] = (len(records), len({r["speaker"] for r in records}))
    return counts


def test_strict_mode_checks_utterances_and_speakers_of_splits_and_release(tmp_path, monkeypatch):
    """With the standard counts set to the fake tree's, strict preparation passes; a missing
    core-test speaker is named by its split's speaker count and by the release's."""
    corpus = make_fake_timit(tmp_path / "corpus", truncate=None)
    prepare_timit(corpus, tmp_path / "partial", "48", strict=False)
    counts = _counts(tmp_path / "partial")
    monkeypatch.setattr(timit, "EXPECTED", {s: n for s, (n, _) in counts.items()})
    monkeypatch.setattr(timit, "EXPECTED_SPEAKERS", {s: k for s, (_, k) in counts.items()})
    wavs = [p for p in corpus.rglob("*") if p.suffix == ".WAV" and p.name.count(".") == 1]
    release = {
        part: (
            sum(1 for w in wavs if w.parts[-4] == part.upper()),
            len({w.parent.name for w in wavs if w.parts[-4] == part.upper()}),
        )
        for part in ("train", "test")
    }
    monkeypatch.setattr(timit, "EXPECTED_RELEASE", release)
    prepare_timit(corpus, tmp_path / "strict", "48")
    assert _counts(tmp_path / "strict") == counts
    n, k = counts["test"]
    monkeypatch.setitem(timit.EXPECTED_SPEAKERS, "test", k + 1)  # the utterances alone agree
    with pytest.raises(CorpusError, match=rf"test: {n} usable SI/SX utterances of {k} speakers"):
        prepare_timit(corpus, tmp_path / "one_speaker_short", "48")
    monkeypatch.setitem(timit.EXPECTED_SPEAKERS, "test", k)

    core = next(p for p in corpus.glob("TEST/*/*") if p.name.lower() in timit.CORE_TEST_SPEAKERS)
    for utterance in list(core.iterdir())[:-1]:  # one utterance of this speaker left, an SA one
        if not utterance.name.startswith("SA"):
            utterance.unlink()
    with pytest.raises(CorpusError) as error:
        prepare_timit(corpus, tmp_path / "missing", "48")
    assert (
        f"test: {n - 2} usable SI/SX utterances of {k - 1} speakers (expected {n} of {k})"
        in str(error.value)
    )
    assert "TEST/: " in str(error.value) and "--allow-partial" in str(error.value)


@pytest.mark.parametrize("where", ["LDC93S1/timit", "data/TRAIN"])
def test_the_corpus_root_is_found_above_or_below_the_given_directory(tmp_path, where):
    """A copy two levels down (``LDC93S1/timit/TIMIT``), or its TRAIN directory given."""
    plain = make_fake_timit(tmp_path / "plain")
    prepare_timit(plain, tmp_path / "plain_out", "48", strict=False)
    if where == "data/TRAIN":
        corpus = make_fake_timit(tmp_path / "copy") / "TRAIN"
    else:
        make_fake_timit(tmp_path / "copy" / "LDC93S1")
        corpus = tmp_path / "copy"
    prepare_timit(corpus, tmp_path / "out", "48", strict=False)
    for split in ("train", "dev", "test"):
        ours = [r["id"] for r in _manifest(tmp_path / "out" / f"{split}.jsonl")]
        assert ours == [r["id"] for r in _manifest(tmp_path / "plain_out" / f"{split}.jsonl")]


def test_an_unreadable_directory_beside_the_copy_is_passed_over(tmp_path, monkeypatch):
    """A disk's ``lost+found`` (unreadable) next to ``LDC93S1/timit/TIMIT`` is not an error."""
    from pathlib import Path

    make_fake_timit(tmp_path / "disk" / "LDC93S1")
    (tmp_path / "disk" / "lost+found").mkdir()
    listing = Path.iterdir

    def iterdir(self):
        if self.name == "lost+found":
            raise PermissionError(13, "Permission denied", str(self))
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    summary = prepare_timit(tmp_path / "disk", tmp_path / "out", "48", strict=False)
    assert summary["utterances"] == {"train": 7, "dev": 3, "test": 6}
