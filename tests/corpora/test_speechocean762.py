"""speechocean762 from a fake tree in the published layout: the Kaldi import, phones chosen by
text-phone among the lexicon's, stress and positions removed, dev speakers held out of train."""

import gzip
import json

import pytest

from cbasr.corpora.download import DownloadError
from cbasr.corpora.prepare import CorpusError
from cbasr.corpora.speechocean762 import (
    PHONES,
    age_group,
    archive_remote,
    dev_speakers,
    download_speechocean762,
    prepare_speechocean762,
    read_lexicon,
    word_phones,
)
from tests.corpora.fake_speechocean762 import SPEAKERS, make_fake_speechocean762
from tests.corpora.http_mirror import Mirror


def _manifest(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_manifests_phones_speakers_and_ages(tmp_path):
    phones_of = make_fake_speechocean762(tmp_path / "c")
    summary = prepare_speechocean762(tmp_path / "c", tmp_path / "out", 1, strict=False)
    assert summary["utterances"] == {"train": 12, "dev": 4, "test": 6} and not summary["skipped"]
    splits = {s: _manifest(tmp_path / "out" / f"{s}.jsonl") for s in ("train", "dev", "test")}
    # the held-out speaker: the middle of the train speakers sorted by age (6, 9, 20, 31)
    assert {r["speaker"] for r in splits["dev"]} == {"1033"}
    assert (tmp_path / "out" / "dev_speakers.txt").read_text() == "1033\n"
    assert {r["speaker"] for r in splits["test"]} == {s for h, s, *_ in SPEAKERS if h == "test"}
    for records in splits.values():
        for r in records:
            assert r["phones"] == phones_of[r["id"]]  # text-phone's choice, stress removed
    first = splits["train"][0]
    assert (first["age"], first["age_group"], first["gender"]) == ("6", "6-12", "m")
    assert (tmp_path / "out" / "phones.txt").read_text().split() == PHONES
    with pytest.raises(CorpusError, match=r"2500 utterances .* found 16; pass --allow-partial"):
        prepare_speechocean762(tmp_path / "c", tmp_path / "strict")
    with pytest.raises(CorpusError, match=r"--dev-speakers 4: the train half has 4 usable"):
        prepare_speechocean762(tmp_path / "c", tmp_path / "all", 4, strict=False)


def test_a_text_phone_entry_outside_the_lexicon_is_a_counted_skip(tmp_path):
    make_fake_speechocean762(tmp_path / "c")
    text_phone = tmp_path / "c" / "resource" / "text-phone"
    lines = text_phone.read_text().splitlines()
    assert lines[0].startswith("000010000.0\t")  # "A": AH0 or EY0
    lines[0] = "000010000.0\tOW0_S"
    text_phone.write_text("\n".join(lines) + "\n")
    summary = prepare_speechocean762(tmp_path / "c", tmp_path / "out", 1, strict=False)
    assert summary["skipped"] == 1
    assert (tmp_path / "out" / "skipped.tsv").read_text() == (
        "train\t000010000\ttext-phone's OW for word 0 (A) not in lexicon\n"
    )


def test_lexicon_and_text_phone_readers(tmp_path):
    (tmp_path / "lexicon.txt").write_text("A\tAH0\nA\tEY0\nCALL\tK AO1 L\n")
    assert read_lexicon(tmp_path / "lexicon.txt") == {
        "A": [("AH",), ("EY",)],
        "CALL": [("K", "AO", "L")],
    }
    (tmp_path / "lexicon.txt").write_text("A\tAHX0\n")
    with pytest.raises(CorpusError, match="line 1: a word and CMUdict phones"):
        read_lexicon(tmp_path / "lexicon.txt")
    (tmp_path / "text-phone").write_text("u1.0\tK_B AO0_I L_E\nu1.1\tAH0_S\n")
    assert word_phones(tmp_path / "text-phone") == {"u1": {0: ("K", "AO", "L"), 1: ("AH",)}}


def test_dev_speakers_spread_over_the_ages_and_groups():
    ages = {f"s{n:02d}": age for n, age in enumerate([6, 6, 7, 9, 12, 15, 20, 21, 30, 40])}
    assert dev_speakers(ages, 2) == ["s02", "s07"]  # the middles of (6 6 7 9 12), (15 .. 40)
    assert dev_speakers(ages, 10) == sorted(ages)
    assert [age_group(a) for a in (6, 12, 13, 18, 19, 43)] == [
        "6-12", "6-12", "13-18", "13-18", "19+", "19+"
    ]  # fmt: skip
    assert archive_remote().url == "https://www.openslr.org/resources/101/speechocean762.tar.gz"
    assert archive_remote().check() == "gzip stream"  # OpenSLR publishes no sum for it


def test_the_download_unpacks_the_archive_once(tmp_path):
    import io
    import tarfile

    make_fake_speechocean762(tmp_path / "src" / "speechocean762")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(tmp_path / "src" / "speechocean762", arcname="speechocean762")
    mirror = Mirror()
    try:
        mirror.files["/101/speechocean762.tar.gz"] = buffer.getvalue()
        root = download_speechocean762(tmp_path / "dl", mirror.url)
        assert root == tmp_path / "dl" / "speechocean762"
        assert (root / "train" / "text").read_text() == (
            tmp_path / "src" / "speechocean762" / "train" / "text"
        ).read_text()
        assert download_speechocean762(tmp_path / "dl", mirror.url) == root
        assert len(mirror.requests) == 1  # extracted: not fetched again
        mirror.files["/101/speechocean762.tar.gz"] = gzip.compress(b"not a tar")
        with pytest.raises(DownloadError, match="speechocean762.tar.gz: cannot extract"):
            download_speechocean762(tmp_path / "other", mirror.url)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(tmp_path / "src" / "speechocean762" / "WAVE", arcname="speechocean762/WAVE")
        mirror.files["/101/speechocean762.tar.gz"] = buffer.getvalue()
        with pytest.raises(CorpusError, match="does not look like speechocean762"):
            download_speechocean762(tmp_path / "third", mirror.url)
    finally:
        mirror.close()
