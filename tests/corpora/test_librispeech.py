"""LibriSpeech manifests from the layouts users keep, strict counts, skips and the unions."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import soundfile

from cbasr.cli.prepare import main as prepare_main
from cbasr.corpora import librispeech
from cbasr.corpora.librispeech import (
    SUBSETS,
    download_librispeech,
    find_subsets,
    prepare_librispeech,
    read_speakers,
    subset_remote,
)
from cbasr.corpora.prepare import CorpusError
from cbasr.data.manifest import audio_path, read_manifest
from tests.corpora.fake_librispeech import fake_archive, make_fake_librispeech, speakers_txt


@pytest.fixture
def fake_counts(monkeypatch):
    """The published counts replaced by the fake tree's (12 utterances of 2 speakers for two
    speakers' subsets, 6 of 1 for one speaker's)."""
    for subset in SUBSETS:
        n = 2 if subset in ("train-clean-5", "train-clean-100") else 1
        monkeypatch.setitem(
            SUBSETS, subset, dataclasses.replace(SUBSETS[subset], utterances=6 * n, speakers=n)
        )


@pytest.mark.parametrize("layout", ["in_place", "deeper", "per_archive"])
def test_every_layout_gives_the_same_manifests(tmp_path, layout, fake_counts):
    corpus = make_fake_librispeech(tmp_path / "corpus", layout=layout)
    summary = prepare_librispeech(corpus, tmp_path / "out")
    assert summary["utterances"] == {"train-clean-5": 12, "dev-clean-2": 6}
    train = read_manifest(tmp_path / "out" / "train-clean-5.jsonl")
    first = train[0]
    assert first["id"] == "19-121-0000" and first["speaker"] == "19" and first["chapter"] == "121"
    assert first["words"] == "THE HOUSE STOOD"
    assert first["gender"] == "f" and train[-1]["gender"] == "m"  # speaker 26
    assert first["duration"] == pytest.approx(0.5)
    assert all((tmp_path / "out" / r["audio"]).is_file() for r in train)
    assert "FATHER'S" in " ".join(r["words"] for r in train)  # apostrophes kept


def test_subsets_found_where_users_keep_them(tmp_path):
    corpus = make_fake_librispeech(
        tmp_path / "c", ("train-clean-5", "dev-clean-2"), layout="per_archive"
    )
    found = find_subsets(corpus)
    assert found == {
        "train-clean-5": corpus / "train-clean-5" / "LibriSpeech" / "train-clean-5",
        "dev-clean-2": corpus / "dev-clean-2" / "LibriSpeech" / "dev-clean-2",
    }
    with pytest.raises(CorpusError, match="LibriSpeech/<subset>/ folders"):
        find_subsets(tmp_path / "c" / "train-clean-5" / "LibriSpeech" / "train-clean-5")
    with pytest.raises(CorpusError, match="no such directory"):
        find_subsets(tmp_path / "nowhere")


def test_one_subset_in_two_places_is_an_error_naming_both(tmp_path):
    make_fake_librispeech(tmp_path / "c", ("dev-clean-2",), layout="in_place")
    make_fake_librispeech(tmp_path / "c", ("dev-clean-2",), layout="deeper")
    with pytest.raises(CorpusError, match=r"two: .*c/dev-clean-2 and .*LibriSpeech/dev-clean-2"):
        find_subsets(tmp_path / "c")


def test_strict_counts_name_the_subset_and_allow_partial_prepares_the_rest(tmp_path, fake_counts):
    corpus = make_fake_librispeech(tmp_path / "c")
    chapter = corpus / "LibriSpeech" / "train-clean-5" / "26" / "1460"
    (chapter / "26-1460-0001.flac").unlink()  # a transcript line without audio
    (chapter / "26-1460-0099.flac").write_bytes(b"not audio, and no transcript line")
    with pytest.raises(CorpusError, match=r"train-clean-5 with 12 utterances of 2 speakers.*11 ut"):
        prepare_librispeech(corpus, tmp_path / "out")
    assert not (tmp_path / "out" / ".done").exists()
    summary = prepare_librispeech(corpus, tmp_path / "out", strict=False)
    assert summary["utterances"]["train-clean-5"] == 11 and summary["skipped"] == 2
    skipped = (tmp_path / "out" / "skipped.tsv").read_text()
    assert "26-1460-0001\taudio" in skipped and "not found" in skipped
    assert "26-1460-0099\tno line in" in skipped


def test_a_requested_subset_that_is_missing_is_named(tmp_path):
    corpus = make_fake_librispeech(tmp_path / "c", ("dev-clean-2",))
    with pytest.raises(CorpusError, match="subsets train-clean-100.*only dev-clean-2"):
        prepare_librispeech(corpus, tmp_path / "out", ["train-clean-100", "dev-clean-2"])


def test_unions_of_the_training_subsets(tmp_path, fake_counts):
    corpus = make_fake_librispeech(
        tmp_path / "c", ("train-clean-100", "train-clean-360", "dev-clean")
    )
    summary = prepare_librispeech(corpus, tmp_path / "out")
    assert summary["utterances"] == {
        "train-clean-100": 12,
        "train-clean-360": 6,
        "dev-clean": 6,
        "train-460": 18,
    }
    union = [r["id"] for r in read_manifest(tmp_path / "out" / "train-460.jsonl")]
    parts = [
        r["id"]
        for s in ("train-clean-100", "train-clean-360")
        for r in read_manifest(tmp_path / "out" / f"{s}.jsonl")
    ]
    assert union == parts


def test_a_rerun_does_nothing_and_other_options_redo(tmp_path, fake_counts, caplog):
    corpus = make_fake_librispeech(tmp_path / "c")
    prepare_librispeech(corpus, tmp_path / "out")
    caplog.set_level("INFO")
    prepare_librispeech(corpus, tmp_path / "out")
    assert "complete, nothing to do" in caplog.text
    summary = prepare_librispeech(corpus, tmp_path / "out", ["dev-clean-2"])
    assert summary["utterances"] == {"dev-clean-2": 6}


def test_cli_prepares_with_allow_partial(tmp_path):
    corpus = make_fake_librispeech(tmp_path / "c")
    with pytest.raises(SystemExit) as exit_info:  # the published counts: 1519 utterances
        prepare_main(["librispeech", "--corpus-dir", str(corpus), "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    prepare_main(
        [
            "librispeech",
            "--corpus-dir",
            str(corpus),
            "--out",
            str(tmp_path / "o"),
            "--subsets",
            "dev-clean-2",
            "--allow-partial",
            "--max-duration",
            "0.9",
        ]
    )
    done = json.loads((tmp_path / "o" / ".done").read_text())
    assert done["utterances"] == {"dev-clean-2": 4} and done["skipped"] == 2  # 1.0 s: too long


def test_speakers_txt_genders(tmp_path):
    path = tmp_path / "SPEAKERS.TXT"
    path.write_text(speakers_txt() + "60   | M | train-clean-100  | 20.18 | |CBW|Simon\n")
    genders = read_speakers(path)
    assert genders["19"] == "f" and genders["26"] == "m" and genders["60"] == "m"


def test_archive_urls_and_sums():
    remote = subset_remote("train-clean-100")
    assert remote.url == "https://www.openslr.org/resources/12/train-clean-100.tar.gz"
    assert remote.sha256 == SUBSETS["train-clean-100"].sha256 and remote.check() == "SHA-256"
    mini = subset_remote("dev-clean-2", "http://mirror.local/slr/")
    assert mini.url == "http://mirror.local/slr/31/dev-clean-2.tar.gz" and mini.check() == "MD5"
    repacked = subset_remote("dev-clean-2", sums={"dev-clean-2.tar.gz": "ab" * 32})
    assert repacked.sha256 == "ab" * 32 and repacked.md5 is None
    with pytest.raises(ValueError, match="unknown LibriSpeech subset 'dev-clean-3'"):
        subset_remote("dev-clean-3")
    assert librispeech.TRAIN_SETS["960"][-1] == "train-other-500"


def test_an_interrupted_extraction_is_extracted_again(tmp_path):
    """A subset folder left by an interrupted extraction (archive there, no marker) is not taken
    as complete: the archive is unpacked again."""
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    data = fake_archive(tmp_path, "dev-clean-2")
    (downloads / "dev-clean-2.tar.gz").write_bytes(data)
    chapter = downloads / "LibriSpeech" / "dev-clean-2" / "103" / "121"
    chapter.mkdir(parents=True)
    (chapter / "103-121-0000.flac").write_bytes(b"fLaC")  # cut short by the interruption
    sums = {"dev-clean-2.tar.gz": hashlib.sha256(data).hexdigest()}
    tree = download_librispeech(["dev-clean-2"], downloads, "http://127.0.0.1:9", sums)
    flacs = sorted((tree / "dev-clean-2").rglob("*.flac"))
    assert len(flacs) == 6 and (tree / "SPEAKERS.TXT").is_file()
    assert soundfile.info(str(chapter / "103-121-0000.flac")).frames == 8000  # 0.5 s, whole
    assert (downloads / ".dev-clean-2.tar.gz.extracted").is_file()
    summary = prepare_librispeech(downloads, tmp_path / "out", strict=False)
    assert summary["utterances"] == {"dev-clean-2": 6} and summary["skipped"] == 0


def test_a_relative_corpus_dir_gives_audio_paths_that_resolve_from_anywhere(
    tmp_path, monkeypatch, fake_counts
):
    """Audio paths are made absolute: a relative --corpus-dir does not leave them relative to
    the directory the preparation ran in."""
    make_fake_librispeech(tmp_path / "work" / "corpus")
    monkeypatch.chdir(tmp_path / "work")
    prepare_librispeech("corpus", "out")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    manifest = tmp_path / "work" / "out" / "dev-clean-2.jsonl"
    records = read_manifest(manifest)
    assert len(records) == 6
    chapter = (tmp_path / "work" / "corpus" / "LibriSpeech" / "dev-clean-2" / "103").resolve()
    for r in records:
        assert Path(r["audio"]).is_absolute() and Path(r["audio"]).is_file()
        assert audio_path(r, manifest) == chapter / r["chapter"] / f"{r['id']}.flac"


def test_the_same_relative_corpus_dir_from_another_directory_is_prepared_again(
    tmp_path, monkeypatch, fake_counts
):
    """A rerun is keyed by the corpus folders resolved: the same relative --corpus-dir naming
    another corpus (run from elsewhere) is not 'complete, nothing to do'."""
    for where in ("a", "b"):
        make_fake_librispeech(tmp_path / where / "corpus")
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path / "a")
    prepare_librispeech("corpus", out)
    monkeypatch.chdir(tmp_path / "b")
    prepare_librispeech("corpus", out)
    corpus_b = (tmp_path / "b" / "corpus").resolve()
    for split in ("train-clean-5", "dev-clean-2"):
        audio = [Path(r["audio"]) for r in read_manifest(out / f"{split}.jsonl")]
        assert len(audio) in (6, 12) and all(a.is_relative_to(corpus_b) for a in audio)


def test_lm_files_are_fetched_from_slr11_by_name_and_an_unknown_one_is_refused():
    from cbasr.corpora.librispeech import lm_remote

    remote = lm_remote("3-gram.pruned.1e-7.arpa.gz", "http://mirror.local/slr/")
    assert remote.url == "http://mirror.local/slr/11/3-gram.pruned.1e-7.arpa.gz"
    assert remote.check() == "gzip stream"  # SLR11 publishes no sums
    with pytest.raises(ValueError, match="unknown LibriSpeech LM file '5-gram.arpa.gz'"):
        lm_remote("5-gram.arpa.gz")
