"""Emission delay: gold ends per token, delays of the correct tokens on hand-built alignments,
the timing file, and the score's median and 90th percentile (through a token map)."""

import json

import pytest

from cbasr.evaluation.delay import (
    delay_summary,
    emission_delays,
    gold_ends,
    read_timing,
    write_timing,
)
from cbasr.evaluation.scoring import align_tokens, score_decode_dir, write_trn


def test_gold_ends_of_words_and_of_phones():
    words = {"words": "one two", "word_ends": [0.4, 0.9]}
    assert gold_ends(words, "words", 2) == [0.4, 0.9]
    phones = {"phones": ["a", "b", "c"], "phone_starts": [0.0, 0.1, 0.25]}
    assert gold_ends(phones, "phones", 3) == [0.1, 0.25, None]  # the last phone has none
    assert gold_ends(phones, "words", 1) is None  # no word times
    assert gold_ends(words, "words", 3) is None  # a count that does not match: none
    assert gold_ends({"words": "x"}, "chars", 1) is None
    assert gold_ends({"words": "a b", "phone_starts": [0.1, 0.2]}, "words", 2) is None  # phones'


def test_delays_pair_the_correct_tokens_by_their_own_positions():
    ref, hyp = "a b c d e".split(), "a x c e".split()
    alignment = align_tokens(ref, hyp)
    assert [op for op, _, _ in alignment] == ["C", "S", "C", "D", "C"]
    ends = [1.0, 2.0, 3.0, 4.0, None]  # e has no gold end
    emitted = [1.5, 2.5, 3.25, 5.0]
    assert emission_delays(alignment, ends, emitted) == [0.5, 0.25]  # a and c, not e
    ends[4] = 4.5
    assert emission_delays(alignment, ends, emitted) == [0.5, 0.25, 0.5]
    inserted = align_tokens(["a"], ["z", "a"])
    assert emission_delays(inserted, [1.0], [0.5, 1.75]) == [0.75]


def test_the_summary_is_the_median_and_the_90th_percentile():
    s = delay_summary([0.01 * i for i in range(1, 11)])  # 10 .. 100 ms
    assert s["units"] == 10
    assert s["p50_ms"] == pytest.approx(55.0) and s["p90_ms"] == pytest.approx(91.0)
    assert delay_summary([]) == {"p50_ms": None, "p90_ms": None, "units": 0}


def test_the_timing_file_reads_back(tmp_path):
    rows = [("u1", [0.5, None], [0.75, 1.0, 1.25]), ("u2", None, []), ("u3", [1.0], [])]
    write_timing(tmp_path / "t.tsv", rows)
    assert read_timing(tmp_path / "t.tsv") == {u: (e, t) for u, e, t in rows}
    (tmp_path / "bad.tsv").write_text("id\tgold_ends\temitted\nu1\t0.5\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected id, gold ends"):
        read_timing(tmp_path / "bad.tsv")


def _decoding(tmp_path, refs, hyps, timing):
    d = tmp_path / "decode/test"
    d.mkdir(parents=True)
    write_trn(d / "ref.trn", list(refs.items()))
    write_trn(d / "hyp.trn", list(hyps.items()))
    write_timing(d / "timing.tsv", timing)
    (d / "decode.json").write_text(json.dumps({"units": "phones", "emission": "streaming"}))
    return d


def test_the_score_reports_the_delays_of_the_correct_tokens_through_the_token_map(tmp_path):
    refs = {"u1": ["a", "q", "b"], "u2": ["c", "d"]}
    hyps = {"u1": ["a", "q", "b"], "u2": ["d"]}
    timing = [
        ("u0", None, [1.0]),  # no gold times: left out
        ("u1", [0.2, 0.3, 0.5], [0.25, 0.9, 0.6]),
        ("u2", [0.1, 0.4], [0.7]),
        ("gone", [0.1], [0.2]),  # not in the references: left out
    ]
    refs["u0"], hyps["u0"] = ["a"], ["a"]
    d = _decoding(tmp_path, refs, hyps, timing)
    s = score_decode_dir(d, bootstrap_samples=10)["emission_delay"]
    assert s["units"] == 4 and s["emission"] == "streaming"
    # delays 0.05 (a), 0.6 (q), 0.1 (b), 0.3 (d): median 0.2 s
    assert s["p50_ms"] == pytest.approx(200.0)
    (tmp_path / "map.txt").write_text("a\ta\nq\t\n")  # q deleted before scoring
    s = score_decode_dir(d, bootstrap_samples=10, token_map=tmp_path / "map.txt")
    assert s["emission_delay"]["units"] == 3
    assert s["emission_delay"]["p50_ms"] == pytest.approx(100.0)  # 0.05, 0.1, 0.3


def test_a_timing_file_that_does_not_fit_the_tokens_is_refused_by_name(tmp_path):
    d = _decoding(tmp_path, {"u1": ["a", "b"]}, {"u1": ["a"]}, [("u1", [0.2, 0.3], [0.4, 0.5])])
    with pytest.raises(
        ValueError, match=r"timing.tsv: utterance u1 has 2 gold ends and 2 emission"
    ):
        score_decode_dir(d, bootstrap_samples=10)
