import json

import pytest

from cbasr.evaluation.scoring import (
    align_tokens,
    bootstrap_interval,
    error_counts,
    format_alignment,
    paired_bootstrap_test,
    read_trn,
    repeat_deletion_counts,
    score_decode_dir,
    sign_test,
    utterance_counts,
    write_trn,
)


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


def _repeats(counts: dict) -> tuple[int, int, int, int]:
    """``(repeat deletions, repeat tokens, other deletions, other tokens)``."""
    keys = ("repeat_deletions", "repeat_tokens", "other_deletions", "other_tokens")
    return tuple(counts[k] for k in keys)


def test_deleting_either_token_of_a_repeat_is_one_repeat_deletion():
    # "two two" against "two": an edit-distance alignment may delete the first or the second
    two_two = ["two", "two"]
    assert _repeats(repeat_deletion_counts(two_two, [True, False])) == (1, 1, 0, 1)
    assert _repeats(repeat_deletion_counts(two_two, [False, True])) == (1, 1, 0, 1)
    (c,) = utterance_counts([two_two], [["two"]])
    assert c["del"] == 1 and _repeats(c) == (1, 1, 0, 1)
    assert _repeats(repeat_deletion_counts(two_two, [True, True])) == (1, 1, 1, 1)


def test_a_run_of_three_loses_repeats_before_its_first_token():
    run = ["a", "a", "a", "b"]  # 2 repeats, 2 other tokens
    for deleted in ([False, True, False, False], [True, False, False, False]):
        assert _repeats(repeat_deletion_counts(run, deleted)) == (1, 2, 0, 2)
    for deleted in ([True, True, False, False], [True, False, True, False]):
        assert _repeats(repeat_deletion_counts(run, deleted)) == (2, 2, 0, 2)
    assert _repeats(repeat_deletion_counts(run, [True, True, True, False])) == (2, 2, 1, 2)
    refs = [run] * 4
    hyps = [["a", "b"], ["b"], ["a", "a", "a", "b"], ["a", "a", "a"]]
    per_utt = utterance_counts(refs, hyps)
    assert [_repeats(c) for c in per_utt] == [
        (2, 2, 0, 2),
        (2, 2, 1, 2),
        (0, 2, 0, 2),
        (0, 2, 1, 2),
    ]
    total = error_counts(refs, hyps)
    assert _repeats(total) == (4, 8, 2, 8) and total["del"] == 6  # every deletion counted once


def test_substituted_repeats_are_not_deletions_and_other_deletions_are_apart():
    (sub, other, both, apart) = utterance_counts(
        [["a", "a", "b"], ["a", "b", "c"], ["a", "a"], ["a", "b", "a"]],
        [["a", "x", "b"], ["a", "c"], ["x"], ["a", "a"]],
    )
    assert (sub["sub"], sub["del"]) == (1, 0) and _repeats(sub) == (0, 1, 0, 2)
    assert other["del"] == 1 and _repeats(other) == (0, 0, 1, 3)
    # one "a" substituted, the other deleted: the run lost one token, a repeat
    assert (both["sub"], both["del"]) == (1, 1) and _repeats(both) == (1, 1, 0, 1)
    # equal tokens that are not neighbours are no repeat
    assert apart["del"] == 1 and _repeats(apart) == (0, 0, 1, 3)
    assert _repeats(utterance_counts([[]], [["a"]])[0]) == (0, 0, 0, 0)


def test_trn_round_trip_and_errors(tmp_path):
    entries = [("spk1-u1", ["aI", "@2", "t"]), ("u2", [])]
    write_trn(tmp_path / "x.trn", entries)
    assert read_trn(tmp_path / "x.trn") == dict(entries)
    (tmp_path / "bad.trn").write_text("a b (u1)\na b c\n")
    with pytest.raises(ValueError, match="bad.trn:2: not a trn line"):
        read_trn(tmp_path / "bad.trn")
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        error_counts([["a"], ["b"]], [["a"]])
    (tmp_path / "twice.trn").write_text("a (u1)\nb (u1)\n")
    with pytest.raises(ValueError, match="twice.trn:2: utterance 'u1' listed twice"):
        read_trn(tmp_path / "twice.trn")


def test_per_utterance_counts_add_up_to_the_totals():
    refs = [["a", "b", "c", "d"], ["x", "y"], [], ["p"]]
    hyps = [["a", "c", "d", "e"], ["x", "z", "y"], ["q"], ["r"]]
    per_utt = utterance_counts(refs, hyps)
    assert [(c["sub"], c["del"], c["ins"], c["ref_tokens"]) for c in per_utt] == [
        (0, 1, 1, 4),
        (0, 0, 1, 2),
        (0, 0, 1, 0),
        (1, 0, 0, 1),
    ]
    total = error_counts(refs, hyps)
    assert (total["sub"], total["del"], total["ins"]) == (1, 1, 3)


def test_the_alignment_file_marks_each_error():
    block = format_alignment("u1", ["a", "bb", "c", "d"], ["a", "x", "c", "e", "d"], speaker="s1")
    assert block == (
        "id: (u1)  speaker: s1\n"
        "Scores: (#C #S #D #I) 3 1 0 1\n"
        "REF:  a  bb  c  ***  d\n"
        "HYP:  a  x   c  e    d\n"
        "Eval:    S      I\n\n"
    )
    assert align_tokens(["a", "b"], ["b"]) == [("D", "a", None), ("C", "b", "b")]


def test_bootstrap_interval_is_reproducible_and_brackets_the_rate():
    errors, refs = [0, 1, 5, 2, 0, 3, 1, 0, 2, 4] * 5, [10] * 50
    low, high = bootstrap_interval(errors, refs, samples=2000, seed=3)
    assert (low, high) == bootstrap_interval(errors, refs, samples=2000, seed=3)
    assert low < 100 * sum(errors) / sum(refs) < high
    # the standard error of a mean over 50 utterances: the interval is about +-1.96 of it
    rates = [100 * e / 10 for e in errors]
    mean = sum(rates) / len(rates)
    se = (sum((r - mean) ** 2 for r in rates) / (len(rates) - 1) / len(rates)) ** 0.5
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.15)
    low4, high4 = bootstrap_interval(errors * 4, refs * 4, samples=2000, seed=3)
    assert (high4 - low4) == pytest.approx(
        (high - low) / 2, rel=0.2
    )  # 4 times the data: half the width


def test_paired_tests_tell_real_differences_from_noise():
    refs = [10] * 40
    a = [1, 0, 2, 1, 0, 1, 3, 0] * 5
    same = paired_bootstrap_test(a, a, refs, samples=2000)
    assert same["difference"] == 0 and same["p_value"] == 1.0
    better = [max(0, e - 1) for e in a]  # one error fewer wherever there was one
    result = paired_bootstrap_test(better, a, refs, samples=2000)
    assert result["difference"] == pytest.approx(-100 * 25 / 400) and result["p_value"] < 0.001
    assert result["p_a_better"] > 0.99 and result["ci95"][1] < 0
    assert paired_bootstrap_test(a, better, refs, samples=2000)["p_value"] < 0.001  # two-sided
    noisy = a[1:] + a[:1]  # the same errors on other utterances: no paired advantage
    assert paired_bootstrap_test(noisy, a, refs, samples=2000)["p_value"] > 0.5
    # sign test by hand: 8 utterances better, none worse: p = 2 / 2^8
    sign = sign_test([0] * 8 + [1, 1], [1] * 8 + [1, 1])
    assert sign == {"a_better": 8, "b_better": 0, "ties": 2, "p_value": pytest.approx(2 / 256)}
    assert sign_test([0, 1], [1, 0])["p_value"] == 1.0
    # thousands of utterances differ (a real test set): exact, no float overflow
    many = sign_test([0] * 1500 + [1] * 1500, [1] * 1500 + [0] * 1500)
    assert many["p_value"] == pytest.approx(1.0, abs=0.02)
    lopsided = sign_test([0] * 1100 + [1] * 900, [1] * 1100 + [0] * 900)
    assert 0 < lopsided["p_value"] < 1e-5  # z = 4.5
    with pytest.raises(ValueError, match="same utterances"):
        paired_bootstrap_test([1], [1, 2], [3, 3])


def test_a_decode_directory_is_scored_per_speaker_with_its_error_file(tmp_path):
    write_trn(tmp_path / "ref.trn", [("u1", ["a", "b"]), ("u2", ["c"]), ("u3", ["d", "e", "f"])])
    write_trn(tmp_path / "hyp.trn", [("u1", ["a"]), ("u2", ["c"]), ("u3", ["d", "x", "f", "g"])])
    (tmp_path / "utt2spk").write_text("u1 s1\nu2 s2\nu3 s1\n")
    s = score_decode_dir(tmp_path, bootstrap_samples=200)
    assert (s["sub"], s["del"], s["ins"], s["ref_tokens"]) == (1, 1, 1, 6)
    assert s["by_speaker"]["s1"]["errors"] == 3 and s["by_speaker"]["s1"]["ref_tokens"] == 5
    assert s["by_speaker"]["s2"]["error_rate"] == 0.0 and s["ci95"][0] <= 50.0 <= s["ci95"][1]
    assert json.loads((tmp_path / "score.json").read_text())["by_speaker"] == s["by_speaker"]
    assert _repeats(s) == (0, 0, 1, 6) and _repeats(s["by_speaker"]["s1"]) == (0, 0, 1, 5)
    assert (tmp_path / "per_utt.tsv").read_text().splitlines()[1:] == [
        "u1\ts1\t2\t0\t1\t0",
        "u2\ts2\t1\t0\t0\t0",
        "u3\ts1\t3\t1\t0\t1",
    ]
    pra = (tmp_path / "errors.pra").read_text()
    assert pra.count("id: (") == 3 and "REF:  a  b\nHYP:  a  ***\nEval:    D\n" in pra
    (tmp_path / "utt2spk").write_text("u1\n")
    with pytest.raises(ValueError, match="utt2spk:1: expected 'utt_id speaker'"):
        score_decode_dir(tmp_path)


def test_groups_of_a_manifest_field_are_scored_with_their_intervals(tmp_path):
    write_trn(tmp_path / "ref.trn", [("u1", ["a", "b"]), ("u2", ["c"]), ("u3", ["d", "e", "f"])])
    write_trn(tmp_path / "hyp.trn", [("u1", ["a"]), ("u2", ["c"]), ("u3", ["d", "x", "f", "g"])])
    groups = {"age_group": {"u1": "6-12", "u3": "6-12", "u2": "19+"}, "gender": {"u1": "f"}}
    s = score_decode_dir(tmp_path, bootstrap_samples=200, groups=groups)
    children, adults = s["by_age_group"]["6-12"], s["by_age_group"]["19+"]
    assert (children["errors"], children["ref_tokens"], children["utts"]) == (3, 5, 2)
    assert (adults["errors"], adults["ref_tokens"], adults["utts"]) == (0, 1, 1)
    assert children["ci95"][0] <= 60.0 <= children["ci95"][1] and adults["ci95"] == [0.0, 0.0]
    assert {k: v["utts"] for k, v in s["by_gender"].items()} == {"f": 1, "unknown": 2}
    assert json.loads((tmp_path / "score.json").read_text())["by_age_group"] == s["by_age_group"]


def test_score_json_counts_repeat_deletions_in_total_and_per_speaker(tmp_path):
    write_trn(
        tmp_path / "ref.trn",
        [("u1", ["two", "two", "one"]), ("u2", ["one", "one", "one"]), ("u3", ["a", "b"])],
    )
    write_trn(tmp_path / "hyp.trn", [("u1", ["two", "one"]), ("u2", []), ("u3", ["b"])])
    (tmp_path / "utt2spk").write_text("u1 s1\nu2 s1\nu3 s2\n")
    s = score_decode_dir(tmp_path, bootstrap_samples=10)
    # u1: a repeat deleted; u2: the run of 3 deleted whole (2 repeats, 1 other); u3: "a" deleted
    assert s["del"] == 5 and _repeats(s) == (3, 3, 2, 5)
    assert _repeats(s["by_speaker"]["s1"]) == (3, 3, 1, 3)
    assert _repeats(s["by_speaker"]["s2"]) == (0, 0, 1, 2)
    written = json.loads((tmp_path / "score.json").read_text())
    assert _repeats(written) == (3, 3, 2, 5) and written["by_speaker"] == s["by_speaker"]


def test_character_decodings_also_get_a_word_error_rate(tmp_path):
    write_trn(tmp_path / "ref.trn", [("u1", list("ab|cd"))])
    write_trn(tmp_path / "hyp.trn", [("u1", list("ab|ce"))])
    (tmp_path / "decode.json").write_text(
        json.dumps({"skipped": 0, "checkpoint": "best", "epoch": 1, "units": "chars"})
    )
    s = score_decode_dir(tmp_path, bootstrap_samples=10)
    assert s["error_rate"] == pytest.approx(20.0)  # 1 of 5 characters
    assert (s["words"]["sub"], s["words"]["ref_tokens"], s["words"]["error_rate"]) == (1, 2, 50.0)


def test_file_digest_is_the_sha256_of_every_block(tmp_path):
    import hashlib

    from cbasr.evaluation.scoring import file_digest

    data = bytes(range(256)) * 5000  # 1.2 MiB: more than one block
    (tmp_path / "a").write_bytes(data)
    (tmp_path / "b").write_bytes(data[:-1] + b"x")  # differs in the second block only
    assert file_digest(tmp_path / "a") == hashlib.sha256(data).hexdigest()
    assert file_digest(tmp_path / "b") != file_digest(tmp_path / "a")


def test_a_score_of_another_hyp_trn_is_refused(tmp_path):
    from cbasr.evaluation.scoring import check_score_is_current

    write_trn(tmp_path / "ref.trn", [("u1", ["a", "b"])])
    write_trn(tmp_path / "hyp.trn", [("u1", ["a", "b"])])
    score_decode_dir(tmp_path)
    check_score_is_current(tmp_path)  # the hyp.trn it scored
    write_trn(tmp_path / "hyp.trn", [("u1", ["a", "c"])])  # a later decoding
    with pytest.raises(ValueError, match="computed from another hyp.trn"):
        check_score_is_current(tmp_path)
