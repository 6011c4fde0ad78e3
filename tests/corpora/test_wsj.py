"""WSJ preparation on fake copies in both layouts, transcript normalisation, Shorten audio."""

import json

import numpy as np
import pytest

from cbasr.corpora.prepare import CorpusError
from cbasr.corpora.wsj import normalize_transcript, prepare_wsj, read_index
from tests.corpora.fake_wsj import NORMALISED, TRUNCATED, make_fake_wsj
from tests.corpora.shorten_writer import shorten_stream, write_wv1


def _ids(out, split):
    return [json.loads(line)["id"] for line in (out / f"{split}.jsonl").read_text().splitlines()]


def test_the_normalisation_rules_on_the_documented_example():
    line = "[loud_breath] The company\\'s I\\. B\\. M\\. unit [<door_slam] <and> %PERCENT --DASH ,COMMA ~ ."
    assert normalize_transcript(line) == [
        "<NOISE>",
        "THE",
        "COMPANY'S",
        "I.",
        "B.",
        "M.",
        "UNIT",
        "AND",
        "PERCENT",
        "-DASH",
        ",COMMA",
    ]
    assert normalize_transcript("a [um] b [door_slam/] [/door_slam] .POINT [cross_talk] <c>") == [
        "A",
        "<SPOKEN_NOISE>",
        "B",
        "POINT",
        "<SPOKEN_NOISE>",
        "C",
    ]


def test_index_entries_in_every_style(tmp_path):
    index = tmp_path / "x.ndx"
    index.write_text(
        ";\n; comment\n11_2_1:wsj0/si_tr_s/011/011c0201.wv1\n13_34_1: /wsj1/si_tr_s/46u/46uc030b.wv1\n"
        "11_14_1:wsj0/si_et_20/440/440c0401\n"
    )
    assert read_index(index) == [
        ("11-2.1", "wsj0/si_tr_s/011/011c0201.wv1"),
        ("13-34.1", "wsj1/si_tr_s/46u/46uc030b.wv1"),
        ("11-14.1", "wsj0/si_et_20/440/440c0401.wv1"),
    ]


@pytest.mark.parametrize("flat", [False, True])
def test_splits_transcripts_and_exclusions(tmp_path, flat):
    corpus = make_fake_wsj(tmp_path / "wsj", flat=flat)
    summary = prepare_wsj(corpus, tmp_path / "out", strict=False)
    out = tmp_path / "out"
    assert _ids(out, "si84") == ["011c0201", "011c0202"]  # speaker 401 left out
    assert _ids(out, "si284") == ["011c0201", "011c0202", "4a0c0201"]  # no 401; 46uc030b: empty
    assert _ids(out, "dev93") == ["4k0c0301", "4k0c0302"]
    assert _ids(out, "eval92") == ["440c0401", "440c0402"]  # entries without .wv1
    assert _ids(out, "eval93") == ["4kbc0401"]  # audio on 13-33.1 (or flat), not the disc named
    skipped = (out / "skipped.tsv").read_text().splitlines()
    assert (
        len(skipped) == 1
        and skipped[0].startswith("si284\t46uc030b\t")
        and "empty transcript" in skipped[0]
    )
    records = {
        json.loads(l)["id"]: json.loads(l)
        for s in ("si284", "dev93", "eval92")
        for l in (out / f"{s}.jsonl").read_text().splitlines()
    }
    for utt, words in NORMALISED.items():
        assert records[utt]["words"] == words
    assert records["011c0201"]["words_with_noise"].endswith(",COMMA <NOISE>")
    assert records["4k0c0301"]["speaker"] == "4k0" and records["4k0c0301"][
        "duration"
    ] == pytest.approx(1.2)
    assert summary["utterances"]["si284"] == 3


def test_not_wsj_or_missing_pieces_say_what_was_expected(tmp_path):
    (tmp_path / "timit").mkdir()
    with pytest.raises(CorpusError, match=r"expected disc directories .* found \['timit'\]"):
        prepare_wsj(tmp_path, tmp_path / "out")
    corpus = make_fake_wsj(tmp_path / "wsj")
    with pytest.raises(
        CorpusError, match=r"expected utterances per split \{'si84': 7138.*found \{'si84': 2"
    ):
        prepare_wsj(corpus, tmp_path / "out")
    (corpus / "13-34.1" / "wsj1" / "doc" / "indices" / "h1_p0.ndx").unlink()
    with pytest.raises(CorpusError, match=r"the dev93 index 13-34.1/wsj1/doc/indices/h1_p0.ndx"):
        prepare_wsj(corpus, tmp_path / "out2", strict=False)


def test_shorten_audio_decodes_exactly_and_truncation_is_reported(tmp_path):
    from cbasr.data.audio import AudioError, read_audio

    rng = np.random.default_rng(0)
    audio = (0.4 * np.sin(np.arange(5000) * 0.05) + 0.01 * rng.standard_normal(5000)).astype(
        np.float32
    )
    write_wv1(tmp_path / "a.wv1", audio)
    header = (tmp_path / "a.wv1").read_bytes()[:1024].decode()
    assert "embedded-shorten-v2.00" in header
    samples, rate = read_audio(tmp_path / "a.wv1")
    expected = np.clip(audio * 32767, -32768, 32767).astype(np.int16) / 32768.0
    assert rate == 16000 and samples.shape == (5000,)
    np.testing.assert_array_equal(samples, expected.astype(np.float32))
    (tmp_path / "b.wv1").write_bytes((tmp_path / "a.wv1").read_bytes()[: 1024 + 400])
    with pytest.raises(AudioError, match=r"b.wv1: .*truncated"):
        read_audio(tmp_path / "b.wv1")
    assert len(shorten_stream(np.zeros(10, dtype=np.int16))) < 40


def test_features_skip_the_truncated_utterance_by_path(tmp_path):
    from cbasr.data.features import FbankOptions, extract_split

    corpus = make_fake_wsj(tmp_path / "wsj")
    prepare_wsj(corpus, tmp_path / "out", strict=False)
    summary = extract_split(
        tmp_path / "out" / "dev93.jsonl",
        tmp_path / "fbank" / "dev93",
        FbankOptions(num_mel_bins=23),
        workers=0,
    )
    assert summary["kept"] == 1 and summary["skipped"] == 1
    line = (tmp_path / "fbank" / "dev93" / "skipped.tsv").read_text()
    assert (
        line.startswith(f"{TRUNCATED}\t") and f"{TRUNCATED}.wv1: " in line and "truncated" in line
    )


def test_disc_directories_through_symlinks_and_an_upper_case_copy(tmp_path):
    """Discs assembled from several drives (symbolic links, one of them a cycle) and an
    upper-case copy under a lower-case parent prepare the same utterances as the plain copy."""
    import os
    import shutil

    corpus = make_fake_wsj(tmp_path / "wsj")
    prepare_wsj(corpus, tmp_path / "plain", strict=False)
    plain = {s: _ids(tmp_path / "plain", s) for s in ("si84", "dev93", "eval92")}
    assert sum(map(len, plain.values())) > 0
    linked = tmp_path / "linked"
    linked.mkdir()
    for disc in corpus.iterdir():
        drive = tmp_path / "drives" / disc.name
        shutil.copytree(disc, drive)
        os.symlink(drive, linked / disc.name)
    os.symlink(linked, linked / next(iter(sorted(corpus.iterdir()))).name / "loop")
    prepare_wsj(linked, tmp_path / "out_linked", strict=False)
    assert {s: _ids(tmp_path / "out_linked", s) for s in plain} == plain
    upper = tmp_path / "lower-case parent" / "wsj"
    shutil.copytree(corpus, upper)
    for path in sorted(upper.rglob("*"), key=lambda p: -len(p.parts)):
        path.rename(path.with_name(path.name.upper()))
    prepare_wsj(upper, tmp_path / "out_upper", strict=False)
    assert {s: _ids(tmp_path / "out_upper", s) for s in plain} == plain
