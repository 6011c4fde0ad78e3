"""Gigaword preparation on fake copies of both released layouts."""

import json

import pytest

from cbasr.corpora.gigaword import prepare_gigaword
from cbasr.corpora.prepare import CorpusError
from tests.corpora.fake_gigaword import PAIRS, make_fake_gigaword


@pytest.mark.parametrize("layout", ["org_data", "sumdata"])
def test_both_layouts_give_the_same_pairs(tmp_path, layout):
    corpus = make_fake_gigaword(tmp_path / "giga", layout)
    summary = prepare_gigaword(tmp_path / "giga", tmp_path / "out", strict=False)
    for split, pairs in PAIRS.items():
        records = [
            json.loads(l) for l in (tmp_path / "out" / f"{split}.jsonl").read_text().splitlines()
        ]
        kept = [(s, t) for s, t in pairs if s]
        assert [(r["source"], r["words"]) for r in records] == kept
    assert summary["utterances"] == {"train": 3, "dev": 2, "test": 2} and summary["skipped"] == 1
    assert (
        (tmp_path / "out" / "skipped.tsv")
        .read_text()
        .startswith("train\ttrain-0000004\tempty article")
    )
    assert corpus.is_dir()


def test_wrong_trees_say_what_was_expected(tmp_path):
    (tmp_path / "timit").mkdir()
    with pytest.raises(
        CorpusError, match=r"expected org_data/ with org_data/train.src.txt.* or sumdata/"
    ):
        prepare_gigaword(tmp_path, tmp_path / "out")
    make_fake_gigaword(tmp_path / "giga")
    with pytest.raises(
        CorpusError, match=r"pairs per split \{'train': 3803957.*found \{'train': 4, 'dev': 2"
    ):
        prepare_gigaword(tmp_path / "giga", tmp_path / "out")
    with open(tmp_path / "giga" / "org_data" / "dev.tgt.txt", "a") as f:
        f.write("one headline too many\n")
    with pytest.raises(CorpusError, match=r"one line per pair; found the source ends at line 2"):
        prepare_gigaword(tmp_path / "giga", tmp_path / "out", strict=False)


def test_sumdata_as_kept_gzip_files_named_by_its_own_directory(tmp_path):
    """The sumdata release with gzip-compressed .txt files, --corpus-dir naming sumdata/ itself."""
    import gzip

    make_fake_gigaword(tmp_path / "giga", "sumdata")
    prepare_gigaword(tmp_path / "giga", tmp_path / "plain", strict=False)
    for path in list((tmp_path / "giga").rglob("*.txt")):
        with gzip.open(f"{path}.gz", "wt", encoding="utf-8") as f:
            f.write(path.read_text(encoding="utf-8"))
        path.unlink()
    summary = prepare_gigaword(tmp_path / "giga" / "sumdata", tmp_path / "out", strict=False)
    assert summary["utterances"] == {"train": 3, "dev": 2, "test": 2}
    for split in PAIRS:
        assert (tmp_path / "out" / f"{split}.jsonl").read_text() == (
            tmp_path / "plain" / f"{split}.jsonl"
        ).read_text()
