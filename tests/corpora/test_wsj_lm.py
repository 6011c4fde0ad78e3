"""WSJ's language-model data on a fake LM disc: the text normalised like the transcripts, the
base ARPA n-grams, a damaged file named, and the pure-Python reader agreeing with gzip's."""

import gzip
import shutil

import pytest

from cbasr.corpora import wsj_lm
from cbasr.corpora.prepare import CorpusError
from cbasr.corpora.wsj_lm import normalize_lm_line, prepare_wsj_lm, read_compressed
from cbasr.lm.arpa import read_arpa
from tests.corpora.compress_writer import compress_bytes
from tests.corpora.fake_wsj import arpa_of, make_fake_wsj, make_fake_wsj_lm


@pytest.mark.parametrize("flat", [False, True])
def test_lm_text_and_base_lms_are_prepared(tmp_path, flat):
    make_fake_wsj(tmp_path / "wsj", flat=flat)
    sentences = make_fake_wsj_lm(tmp_path / "wsj", flat=flat)
    summary = prepare_wsj_lm(tmp_path / "wsj", tmp_path / "lm")
    assert (tmp_path / "lm" / "lm_train.txt").read_text().splitlines() == sentences
    assert summary["sentences"] == 300 and summary["files"] == 6
    assert summary["words"] == sum(len(s.split()) for s in sentences)
    assert summary["skipped_lines"] == 6 * 6  # the markup lines of every file
    assert summary["arpa"] == ["bcb20onp.arpa.gz", "tcb20onp.arpa.gz"]
    trigram = gzip.decompress((tmp_path / "lm" / "tcb20onp.arpa.gz").read_bytes()).decode()
    assert trigram == arpa_of(sentences, 3)
    assert read_arpa(tmp_path / "lm" / "bcb20onp.arpa.gz").order == 2
    (tmp_path / "lm" / "lm_train.txt").write_text("changed\n")  # a rerun with the same options:
    prepare_wsj_lm(tmp_path / "wsj", tmp_path / "lm")  # complete, so nothing is redone
    assert (tmp_path / "lm" / "lm_train.txt").read_text() == "changed\n"


def test_the_pure_python_reader_agrees_with_gzip(tmp_path, monkeypatch):
    data = ("<p>\nstocks fell\n" * 400).encode()
    path = tmp_path / "x.z"
    path.write_bytes(compress_bytes(data))
    assert read_compressed(path) == data
    monkeypatch.setattr(wsj_lm.shutil, "which", lambda name: None)  # no gzip: unlzw3
    assert read_compressed(path) == data
    path.write_bytes(compress_bytes(data)[:-40] + b"\xff" * 3)  # damaged
    with pytest.raises(CorpusError, match=r"x\.z: not a readable compressed file"):
        read_compressed(path)
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"not compressed\n")
    assert read_compressed(plain) == b"not compressed\n"


def test_missing_pieces_are_named_unless_partial(tmp_path):
    make_fake_wsj(tmp_path / "wsj")
    with pytest.raises(CorpusError, match=r"13-32\.1/wsj1/doc/lng_modl .*no such directory"):
        prepare_wsj_lm(tmp_path / "wsj", tmp_path / "lm")
    sentences = make_fake_wsj_lm(tmp_path / "wsj")
    lng_modl = tmp_path / "wsj" / "13-32.1" / "wsj1" / "doc" / "lng_modl"
    shutil.rmtree(lng_modl / "lm_train" / "np_data" / "88")
    shutil.rmtree(lng_modl / "base_lm")
    with pytest.raises(CorpusError, match=r"no lm_train/np_data/88, base_lm; pass --allow-partial"):
        prepare_wsj_lm(tmp_path / "wsj", tmp_path / "lm")
    summary = prepare_wsj_lm(tmp_path / "wsj", tmp_path / "lm", strict=False)
    assert summary["missing"] == ["lm_train/np_data/88", "base_lm"] and summary["arpa"] == []
    text = (tmp_path / "lm" / "lm_train.txt").read_text().splitlines()
    assert text == sentences[:100] + sentences[200:]


def test_lm_lines_are_normalised_as_transcripts():
    assert normalize_lm_line("<p>") == []
    assert normalize_lm_line("   ") == []
    assert normalize_lm_line("the u.\\s. [noise] company's %percent rise") == (
        "THE U.S. COMPANY'S PERCENT RISE".split()
    )


def test_directories_without_compressed_files_are_not_a_complete_copy(tmp_path):
    make_fake_wsj(tmp_path / "wsj")
    make_fake_wsj_lm(tmp_path / "wsj")
    base_lm = tmp_path / "wsj" / "13-32.1" / "wsj1" / "doc" / "lng_modl" / "base_lm"
    for path in base_lm.iterdir():
        path.unlink()
    with pytest.raises(CorpusError, match="6 text files and 0 ARPA files; pass --allow-partial"):
        prepare_wsj_lm(tmp_path / "wsj", tmp_path / "lm")
    assert prepare_wsj_lm(tmp_path / "wsj", tmp_path / "lm", strict=False)["arpa"] == []
