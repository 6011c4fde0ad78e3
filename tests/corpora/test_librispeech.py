"""LibriSpeech manifests from the layouts users keep, strict counts, skips and the unions."""

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
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


OFFLINE = "http://127.0.0.1:9"  # nothing listens: a test that reaches the network fails


def _archives_in(downloads: Path, archives: dict[str, bytes]) -> dict[str, str]:
    """Put ``<subset>.tar.gz`` files in ``downloads`` as an earlier download would; their sums."""
    downloads.mkdir(parents=True, exist_ok=True)
    for subset, data in archives.items():
        (downloads / f"{subset}.tar.gz").write_bytes(data)
    return {f"{s}.tar.gz": hashlib.sha256(d).hexdigest() for s, d in archives.items()}


def test_archives_are_kept_by_default_and_removed_after_extraction_when_asked(tmp_path):
    """keep_archives defaults to True (the archive stays); False removes it once extracted."""
    data = fake_archive(tmp_path, "dev-clean-2")
    kept, removed = tmp_path / "kept", tmp_path / "removed"
    sums = _archives_in(kept, {"dev-clean-2": data})
    _archives_in(removed, {"dev-clean-2": data})
    tree = download_librispeech(["dev-clean-2"], kept, OFFLINE, sums)
    assert tree == kept / "LibriSpeech"
    assert (kept / "dev-clean-2.tar.gz").read_bytes() == data
    assert len(list((tree / "dev-clean-2").rglob("*.flac"))) == 6
    tree = download_librispeech(["dev-clean-2"], removed, OFFLINE, sums, keep_archives=False)
    assert not (removed / "dev-clean-2.tar.gz").exists()
    assert len(list((tree / "dev-clean-2").rglob("*.flac"))) == 6


def test_an_extracted_subset_is_not_fetched_again_and_the_next_subsets_still_are(
    tmp_path, monkeypatch
):
    """A subset with its extraction marker is skipped without fetching (re-checking) its archive,
    and skipping it goes on to the remaining subsets instead of stopping."""
    downloads = tmp_path / "downloads"
    sums = _archives_in(downloads, {"dev-clean-2": fake_archive(tmp_path, "dev-clean-2")})
    download_librispeech(["dev-clean-2"], downloads, OFFLINE, sums)
    sums |= _archives_in(downloads, {"train-clean-5": fake_archive(tmp_path, "train-clean-5")})
    fetched = []
    real_fetch = librispeech.fetch

    def recording_fetch(remote, directory, *args, **kwargs):
        fetched.append(remote.name)
        return real_fetch(remote, directory, *args, **kwargs)

    monkeypatch.setattr(librispeech, "fetch", recording_fetch)
    tree = download_librispeech(["dev-clean-2", "train-clean-5"], downloads, OFFLINE, sums)
    assert fetched == ["train-clean-5.tar.gz"]
    assert len(list((tree / "train-clean-5").rglob("*.flac"))) == 12
    assert (downloads / ".train-clean-5.tar.gz.extracted").is_file()


def test_an_archive_without_its_subset_folder_is_an_error_and_is_not_removed(tmp_path):
    """An archive that does not unpack to LibriSpeech/<subset>/ (a wrong file under the name) is
    refused naming the folder expected, and is kept even with keep_archives=False."""
    downloads = tmp_path / "downloads"
    wrong = fake_archive(tmp_path, "dev-clean-2")
    sums = _archives_in(downloads, {"train-clean-5": wrong})
    with pytest.raises(CorpusError, match=r"LibriSpeech/train-clean-5/ inside; found no such"):
        download_librispeech(["train-clean-5"], downloads, OFFLINE, sums, keep_archives=False)
    assert (downloads / "train-clean-5.tar.gz").read_bytes() == wrong


def test_a_subset_folder_needs_one_speaker_folder_and_may_hold_stray_files(tmp_path):
    """A subset folder counts when any entry is a numeric speaker folder: a stray file beside the
    speakers does not hide it, and an empty folder of a subset's name is not a subset."""
    corpus = make_fake_librispeech(tmp_path / "c", ("dev-clean-2",))
    (corpus / "LibriSpeech" / "dev-clean-2" / ".DS_Store").write_bytes(b"\0")
    (corpus / "LibriSpeech" / "train-clean-5").mkdir()  # an extraction not started
    assert find_subsets(corpus) == {"dev-clean-2": corpus / "LibriSpeech" / "dev-clean-2"}


def test_a_linked_subset_reached_twice_through_a_relative_corpus_dir_is_one_subset(
    tmp_path, monkeypatch
):
    """The same folder reached by two routes (a LibriSpeech link to an extracted archive's
    folder) is one subset, also when --corpus-dir is relative: both sides are resolved."""
    corpus = make_fake_librispeech(tmp_path / "c", ("dev-clean-2",), layout="per_archive")
    (corpus / "LibriSpeech").symlink_to("dev-clean-2/LibriSpeech", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    assert find_subsets("c") == {"dev-clean-2": Path("c/LibriSpeech/dev-clean-2")}


def test_speakers_txt_needs_a_numeric_id_and_m_or_f_in_either_case(tmp_path):
    """SPEAKERS.TXT lines count with just ID | SEX and a lower-case sex; a line whose ID is not a
    number or whose sex is not M/F is ignored."""
    path = tmp_path / "SPEAKERS.TXT"
    lines = [
        "; ID | SEX | SUBSET | MINUTES | NAME",
        "ID   | SEX | SUBSET | MINUTES | NAME",
        "60   | M",
        "61   | f | train-clean-100 | 20.18 | Ann",
        "62   | U | train-clean-100 | 20.18 | Unknown",
        "63   |   | train-clean-100 | 20.18 | Blank",
        "X64  | F | train-clean-100 | 20.18 | Not an id",
        "65 M train-clean-100 no bars",
    ]
    path.write_text("\n".join(lines) + "\n")
    assert read_speakers(path) == {"60": "m", "61": "f"}


def test_transcript_blank_and_indented_lines_are_read_and_a_foreign_id_is_named_by_line(tmp_path):
    """A blank line does not end a transcript, an indented line is read, and a line with another
    chapter's id is skipped as 'not an id' of this chapter, at its 1-based line number."""
    corpus = make_fake_librispeech(tmp_path / "c", ("dev-clean-2",))
    chapter = corpus / "LibriSpeech" / "dev-clean-2" / "103" / "121"
    transcript = chapter / "103-121.trans.txt"
    lines = [
        "103-121-0000 THE HOUSE STOOD",
        "",
        "   103-121-0001 ON A  HILL",
        "103-1460-0000 A LINE OF THE OTHER CHAPTER",
        "103-121-0002 ABOVE THE RIVER",
    ]
    transcript.write_text("\n".join(lines) + "\n")
    summary = prepare_librispeech(corpus, tmp_path / "out", strict=False)
    assert summary["utterances"] == {"dev-clean-2": 6} and summary["skipped"] == 1
    words = {r["id"]: r["words"] for r in read_manifest(tmp_path / "out" / "dev-clean-2.jsonl")}
    assert words["103-121-0001"] == "ON A HILL" and words["103-121-0002"] == "ABOVE THE RIVER"
    assert (tmp_path / "out" / "skipped.tsv").read_text() == (
        f"dev-clean-2\t103-1460-0000\t{transcript}:4: not an id of 103-121\n"
    )


def test_unreadable_audio_is_reported_and_the_rest_of_its_chapter_is_still_read(tmp_path):
    """A corrupt FLAC with a transcript line is listed in skipped.tsv as unreadable, and the
    chapter's later utterances are still prepared."""
    corpus = make_fake_librispeech(tmp_path / "c", ("dev-clean-2",))
    chapter = corpus / "LibriSpeech" / "dev-clean-2" / "103" / "121"
    (chapter / "103-121-0000.flac").write_bytes(b"fLaC, then nothing a decoder can read")
    summary = prepare_librispeech(corpus, tmp_path / "out", strict=False)
    assert summary["utterances"] == {"dev-clean-2": 5} and summary["skipped"] == 1
    ids = [r["id"] for r in read_manifest(tmp_path / "out" / "dev-clean-2.jsonl")]
    assert ids[:2] == ["103-121-0001", "103-121-0002"]
    skipped = (tmp_path / "out" / "skipped.tsv").read_text()
    assert skipped.startswith(f"dev-clean-2\t103-121-0000\t{chapter / '103-121-0000.flac'}: unre")


def test_a_transcript_line_without_words_is_reported_as_an_empty_transcript(tmp_path):
    """An id with no words is skipped with the reason 'empty transcript' at its line."""
    corpus = make_fake_librispeech(tmp_path / "c", ("dev-clean-2",))
    transcript = corpus / "LibriSpeech" / "dev-clean-2" / "103" / "121" / "103-121.trans.txt"
    transcript.write_text("103-121-0000 THE HOUSE\n103-121-0001\n103-121-0002 STOOD\n")
    summary = prepare_librispeech(corpus, tmp_path / "out", strict=False)
    assert summary["utterances"] == {"dev-clean-2": 5}
    skipped = (tmp_path / "out" / "skipped.tsv").read_text()
    assert f"dev-clean-2\t103-121-0001\t{transcript}:2: empty transcript\n" in skipped
    # once: its line is there (empty), so it is not also "no line in" the transcript
    assert [line for line in skipped.splitlines() if "103-121-0001" in line] == [
        f"dev-clean-2\t103-121-0001\t{transcript}:2: empty transcript"
    ]


def test_durations_are_frames_over_rate_rounded_to_four_decimals(tmp_path):
    """A manifest duration is the FLAC's frames / sample rate, rounded to 4 decimals as in every
    corpus's manifests."""
    corpus = make_fake_librispeech(tmp_path / "c", ("dev-clean-2",))
    flac = corpus / "LibriSpeech" / "dev-clean-2" / "103" / "121" / "103-121-0000.flac"
    soundfile.write(flac, np.zeros(8001, dtype=np.float32), 16000, format="FLAC")
    prepare_librispeech(corpus, tmp_path / "out", strict=False)
    durations = {
        r["id"]: r["duration"] for r in read_manifest(tmp_path / "out" / "dev-clean-2.jsonl")
    }
    assert durations["103-121-0000"] == 0.5001 and durations["103-121-0001"] == 0.75


def test_the_strict_count_error_gives_the_number_skipped_in_that_subset(tmp_path, fake_counts):
    """The strict error counts the skips of the failing subset only, not of subsets read before."""
    corpus = make_fake_librispeech(tmp_path / "c")
    train = corpus / "LibriSpeech" / "train-clean-5" / "19" / "121"
    (train / "19-121-0099.flac").write_bytes(b"no transcript line: skipped, counts still right")
    dev = corpus / "LibriSpeech" / "dev-clean-2" / "103" / "121"
    (dev / "103-121-0001.flac").unlink()
    (dev / "103-121-0099.flac").write_bytes(b"no transcript line")
    with pytest.raises(
        CorpusError,
        match=r"with 6 utterances of 1 speakers; found 5 utterances of 1 speakers \(2 skipped:",
    ):
        prepare_librispeech(corpus, tmp_path / "out")
