import pytest

from cbasr.engines.scoring import error_counts, read_trn, write_trn


def test_hand_worked_counts():
    refs = [["a", "b", "c", "d"], ["x", "y"]]
    hyps = [["a", "c", "d", "e"], ["x", "z", "y"]]
    # utt 1: b deleted, e inserted; utt 2: z inserted -> 1 del, 2 ins over 6 reference tokens
    s = error_counts(refs, hyps)
    assert (s["sub"], s["del"], s["ins"], s["hits"], s["ref_tokens"]) == (0, 1, 2, 5, 6)
    assert s["error_rate"] == pytest.approx(50.0)
    s = error_counts([["a", "b"]], [["c"]])
    assert (s["sub"], s["del"], s["ins"], s["errors"]) == (1, 1, 0, 2)
    s = error_counts([["a", "b"]], [[]])
    assert (s["del"], s["error_rate"]) == (2, 100.0)


def test_trn_round_trip_and_errors(tmp_path):
    entries = [("spk1-u1", ["aI", "@2", "t"]), ("u2", [])]
    write_trn(tmp_path / "x.trn", entries)
    assert read_trn(tmp_path / "x.trn") == dict(entries)
    (tmp_path / "bad.trn").write_text("a b (u1)\na b c\n")
    with pytest.raises(ValueError, match="bad.trn:2: not a trn line"):
        read_trn(tmp_path / "bad.trn")
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        error_counts([["a"], ["b"]], [["a"]])
