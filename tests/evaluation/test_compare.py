"""cbasr-compare's engine: systems from experiment directories, the table's numbers, the paired
test on shared utterances, and errors that name what is missing."""

import csv
import json

import pytest

from cbasr.cli import compare
from cbasr.evaluation.compare import (
    collect_systems,
    comparison_rows,
    describe_settings,
    paired_comparison,
    seed_rows,
    seed_table,
)
from cbasr.evaluation.scoring import score_decode_dir, write_trn

REFS = {f"u{i}": ["a", "b", "c", "d"] for i in range(20)}


def _decoding(exp, name, hyps, settings=None, parameters=1234567, epoch=7, score=True, refs=REFS):
    d = exp / "decode" / name
    write_trn(d / "ref.trn", sorted(refs.items()))
    write_trn(d / "hyp.trn", sorted(hyps.items()))
    (d / "decode.json").write_text(
        json.dumps(
            {
                "checkpoint": "best",
                "epoch": epoch,
                "skipped": 0,
                "settings": settings or {"search": "greedy"},
                "parameters": parameters,
                "rtf": 0.01,
            }
        )
    )
    if score:
        score_decode_dir(d, bootstrap_samples=100)
    return d


@pytest.fixture
def experiments(tmp_path):
    good = {
        u: ["a", "b", "c", "d"] if i % 4 else ["a", "b", "c"] for i, u in enumerate(REFS)
    }  # 5 deletions
    bad = {u: ["a", "x", "c", "d", "e"] for u in REFS}  # 20 substitutions, 20 insertions
    _decoding(tmp_path / "ctc", "test", good)
    _decoding(
        tmp_path / "ctc",
        "test_beam8",
        good,
        {"search": "beam", "beam": 8, "lm": "/x/lm.arpa", "lm_weight": 0.5},
    )
    _decoding(
        tmp_path / "cb", "test", bad, parameters=2500000, epoch=9, score=False
    )  # per_utt from the trn files
    return tmp_path / "ctc", tmp_path / "cb"


def test_rows_hold_rates_counts_and_settings(experiments):
    systems = collect_systems(list(experiments))
    assert [s.label for s in systems] == ["ctc:test", "ctc:test_beam8", "cb:test"]
    rows = {r["system"]: r for r in comparison_rows(systems, samples=200)}
    assert rows["ctc:test"]["error_rate"] == pytest.approx(100 * 5 / 80)
    assert (rows["cb:test"]["sub"], rows["cb:test"]["del"], rows["cb:test"]["ins"]) == (20, 0, 20)
    assert (
        rows["cb:test"]["ci95_low"] == rows["cb:test"]["ci95_high"] == 50.0
    )  # every utterance alike
    assert (
        rows["ctc:test_beam8"]["decode"] == "beam 8, lm 0.5 (lm.arpa)"
        and rows["cb:test"]["decode"] == "greedy"
    )
    assert (rows["cb:test"]["parameters"], rows["cb:test"]["epochs"]) == (2500000, 9)
    only = collect_systems(list(experiments), decodes=["test"])
    assert [s.label for s in only] == ["ctc:test", "cb:test"]


def test_rows_hold_training_time_and_dev_alignment(experiments, capsys):
    ctc, cb = experiments
    (ctc / "history.json").write_text(
        json.dumps([{"epoch": 1, "seconds": 60.0}, {"epoch": 2, "seconds": 90.0}])
    )
    (ctc / "align" / "dev").mkdir(parents=True)
    (ctc / "align" / "dev" / "alignment.json").write_text(
        json.dumps({"mean_abs_onset_error_ms": 21.25, "within_20ms": 0.604})
    )
    rows = {r["system"]: r for r in comparison_rows(collect_systems([ctc, cb]), samples=50)}
    assert rows["ctc:test"]["train_minutes"] == pytest.approx(2.5)
    assert (rows["ctc:test"]["dev_onset_error_ms"], rows["ctc:test"]["dev_onsets_within_20ms"]) == (
        21.25,
        0.604,
    )
    assert (
        rows["cb:test"]["train_minutes"] is None and rows["cb:test"]["dev_onset_error_ms"] is None
    )
    compare.main([str(ctc), str(cb), "--bootstrap", "50"])
    out = capsys.readouterr().out
    assert "| greedy | 0.0100 | 2.5 | 21.2 / 60% |" in out and "| greedy | 0.0100 |  |  |" in out


def test_the_paired_test_uses_the_shared_utterances(experiments):
    systems = {s.label: s for s in collect_systems(list(experiments))}
    result = paired_comparison(systems["ctc:test"], systems["cb:test"], samples=500)
    assert result["utts"] == 20 and result["bootstrap"]["difference"] == pytest.approx(
        100 * (5 - 40) / 80
    )
    assert result["bootstrap"]["p_value"] < 0.01 and result["sign_test"]["a_better"] == 20
    systems["cb:test"].counts = {"v1": {"sub": 0, "del": 0, "ins": 0, "ref_tokens": 3}}
    with pytest.raises(ValueError, match="share no utterance"):
        paired_comparison(systems["ctc:test"], systems["cb:test"])


def test_the_command_prints_markdown_writes_csv_and_pairs_systems(experiments, tmp_path, capsys):
    _decoding(experiments[1], "dev", REFS)  # only cb has it: not paired
    compare.main(
        [str(e) for e in experiments]
        + [
            "--csv",
            str(tmp_path / "t.csv"),
            "--pair",
            "ctc",
            "cb",
            "--bootstrap",
            "100",
            "--paired-bootstrap",
            "500",
        ]
    )
    out = capsys.readouterr().out
    assert (
        "| ctc:test | 6.25 |" in out
        and "| cb:test | 50.00 | [50.00, 50.00] | 20 | 0 | 20 | 80 | 20 | 2.50 M | 9 |" in out
    )
    paired = [line for line in out.splitlines() if line.count(":") == 2]
    assert len(paired) == 1 and paired[0].startswith(
        "| ctc:test | cb:test | 20 | 6.25 | 50.00 | -43.75 |"
    )
    csv = (tmp_path / "t.csv").read_text().splitlines()
    assert csv[0].startswith("system,error_rate,ci95_low,ci95_high,sub,del,ins") and len(csv) == 5
    with pytest.raises(SystemExit):
        compare.main([str(experiments[0]), "--pair", "ctc:test", "nope"])
    assert "no system 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.main([str(experiments[0]), "--decodes", "dev"])
    assert "no decoding 'dev'" in capsys.readouterr().err


def test_settings_are_described_briefly():
    assert describe_settings({"search": "greedy"}) == "greedy"
    assert (
        describe_settings(
            {
                "search": "beam",
                "beam": 4,
                "am_weight": 2.5,
                "ilm_weight": 0.9,
                "lm": "a/b.pt",
                "lm_weight": 1.0,
                "max_symbols": 3,
            }
        )
        == "beam 4, lm 1 (b.pt), am 2.5, ilm 0.9, max 3/frame"
    )


def test_update_merges_rows_into_an_existing_csv(experiments, tmp_path, capsys):
    """--update: the compared experiments' rows replace theirs, the others stay."""
    table = tmp_path / "t.csv"
    compare.main([str(e) for e in experiments] + ["--csv", str(table), "--bootstrap", "50"])
    before = table.read_text().splitlines()
    cb_row = next(line for line in before if line.startswith("cb:"))
    _decoding(experiments[0], "test", {u: ["a", "b", "c", "d"] for u in REFS})  # ctc now perfect
    compare.main([str(experiments[0]), "--csv", str(table), "--update", "--bootstrap", "50"])
    after = table.read_text().splitlines()
    assert after[0] == before[0] and cb_row in after  # the other experiment's rows kept
    rates = {line.split(",")[0]: float(line.split(",")[1]) for line in after[1:]}
    assert rates["ctc:test"] == 0.0 and rates["ctc:test_beam8"] == 6.25
    assert len(after) == len(before)
    compare.main([str(experiments[0]), "--csv", str(table), "--bootstrap", "50"])
    assert all(line.startswith(("system", "ctc:")) for line in table.read_text().splitlines())


REPEATED = {f"u{i}": ["two", "two", "one", "b"] for i in range(4)}  # 1 repeat, 3 other tokens


@pytest.fixture
def repeat_experiments(tmp_path):
    """``rep`` (scored: one repeat deleted in every utterance, one "b" deleted in the first),
    ``trn`` (not scored: counted from its trn files) and ``old`` (a score.json from before the
    repeat counts)."""
    merged = {u: ["two", "one"] + ([] if i == 0 else ["b"]) for i, u in enumerate(REPEATED)}
    _decoding(tmp_path / "rep", "test", merged, refs=REPEATED)
    _decoding(tmp_path / "trn", "test", dict(REPEATED), refs=REPEATED, score=False)
    old = _decoding(tmp_path / "old", "test", merged, refs=REPEATED)
    score = json.loads((old / "score.json").read_text())
    for key in ("repeat_deletions", "repeat_tokens", "other_deletions", "other_tokens"):
        del score[key]
    (old / "score.json").write_text(json.dumps(score))
    return [tmp_path / name for name in ("rep", "trn", "old")]


def test_the_csv_has_repeat_deletion_columns_empty_for_an_old_score(repeat_experiments, tmp_path):
    compare.main([str(e) for e in repeat_experiments] + ["--csv", str(tmp_path / "t.csv")])
    rows = {r["system"]: r for r in csv.DictReader(open(tmp_path / "t.csv"))}
    columns = ["repeat_deletions", "repeat_tokens", "other_deletions", "other_tokens"]
    assert list(rows["rep:test"])[-6:-2] == columns
    assert list(rows["rep:test"])[-2:] == ["emission_delay_p50_ms", "emission_delay_p90_ms"]
    assert rows["rep:test"]["emission_delay_p50_ms"] == ""  # no timing.tsv: not measured
    assert [rows["rep:test"][k] for k in columns] == ["4", "4", "1", "12"]
    assert [rows["trn:test"][k] for k in columns] == ["0", "4", "0", "12"]
    assert [rows["old:test"][k] for k in columns] == ["", "", "", ""]
    assert rows["old:test"]["del"] == "5"  # the rest of an old score's row is there


def test_the_markdown_table_shows_repeat_deletions_on_request(repeat_experiments, capsys):
    compare.main([str(e) for e in repeat_experiments] + ["--bootstrap", "20"])
    plain = capsys.readouterr().out
    assert plain.splitlines()[0].startswith(
        "| system | error rate (%) | 95% CI | sub | del | ins | ref tokens |"
    )
    assert "repeat" not in plain
    assert "emission delay" not in plain  # no decoding measured one: no column
    compare.main([str(e) for e in repeat_experiments] + ["--bootstrap", "20", "--repeats"])
    lines = capsys.readouterr().out.splitlines()
    assert "| ins | repeats deleted | others deleted | ref tokens |" in lines[0]
    assert lines[1].count("|") == lines[0].count("|")
    assert "| 0 | 5 | 0 | 4 / 4 (100.0%) | 1 / 12 (8.3%) | 16 |" in lines[2]
    assert "| 0 | 0 | 0 | 0 / 4 (0.0%) | 0 / 12 (0.0%) | 16 |" in lines[3]
    assert "| 0 | 5 | 0 |  |  | 16 |" in lines[4]


@pytest.mark.parametrize("later", [4 + 2, 2])
def test_update_adds_the_later_columns_to_an_older_csv(experiments, tmp_path, later):
    """A CSV written before the repeat and delay columns existed, or before the delay ones."""
    table = tmp_path / "t.csv"
    compare.main([str(e) for e in experiments] + ["--csv", str(table), "--bootstrap", "50"])
    header, *lines = table.read_text().splitlines()
    cut = lambda line: ",".join(line.split(",")[:-later])  # noqa: E731
    table.write_text("\n".join(cut(line) for line in [header, *lines]) + "\n")  # before them
    compare.main([str(experiments[0]), "--csv", str(table), "--update", "--bootstrap", "50"])
    rows = {r["system"]: r for r in csv.DictReader(open(table))}
    assert rows["ctc:test"]["repeat_tokens"] == "0" and rows["ctc:test"]["other_tokens"] == "80"
    assert rows["cb:test"]["emission_delay_p50_ms"] == ""  # the older row, kept, has them empty
    assert (rows["cb:test"]["repeat_tokens"] == "") == (later == 6)
    assert cut(next(line for line in lines if line.startswith("cb:"))) in table.read_text()


def test_a_decoding_without_a_parameter_record_asks_the_callers_counter(tmp_path):
    """Evaluation reads no checkpoint (no torch): the counter comes from the caller."""
    d = _decoding(tmp_path / "old", "test", REFS)
    info = json.loads((d / "decode.json").read_text())
    del info["parameters"]
    (d / "decode.json").write_text(json.dumps(info))
    (tmp_path / "old/checkpoints").mkdir()
    (tmp_path / "old/checkpoints/best.pt").write_bytes(b"a checkpoint")
    asked = []
    systems = collect_systems([tmp_path / "old"], count_parameters=lambda p: asked.append(p) or 42)
    assert systems[0].parameters == 42 and asked == [tmp_path / "old/checkpoints/best.pt"]
    assert collect_systems([tmp_path / "old"])[0].parameters is None


def test_a_malformed_per_utterance_line_is_named_by_its_line(tmp_path):
    d = _decoding(tmp_path / "ctc", "test", {u: ["a", "b", "c", "d"] for u in REFS})
    lines = (d / "per_utt.tsv").read_text().splitlines()
    lines[2] = lines[2].split("\t")[0] + "\tnot a number"  # the file's third line
    (d / "per_utt.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"per_utt\.tsv:3: malformed line"):
        collect_systems([tmp_path / "ctc"])


def test_one_utterance_with_another_reference_refuses_the_pairing(tmp_path):
    hyps = {u: ["a", "b", "c", "d"] for u in REFS}
    _decoding(tmp_path / "a", "test", hyps)
    other = dict(REFS, u3=["a", "b", "c"])  # one reference of twenty differs
    _decoding(tmp_path / "b", "test", hyps, refs=other)
    a, b = collect_systems([tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ValueError, match="different references for the same utterances"):
        paired_comparison(a, b, samples=10)


def _row(system: str, rate: float, repeats: tuple | None, others: tuple | None) -> dict:
    row = {"system": system, "error_rate": rate}
    row["repeat_deletions"], row["repeat_tokens"] = repeats or (None, None)
    row["other_deletions"], row["other_tokens"] = others or (None, None)
    return row


def test_seeds_pool_into_one_row_per_experiment_and_decoding():
    """X, X_s2 and X_s3 of a decoding are one row: the seeds' rates in seed order, their mean,
    the deletions summed; the repeat check compares the pooled rates."""
    rows = [
        _row("rnnt_s3:test", 5.0, (3, 100), (10, 1000)),
        _row("rnnt:test", 4.0, (1, 100), (5, 1000)),
        _row("rnnt_s2:test", 3.0, (2, 100), (5, 1000)),
        _row("rnnt:repeats", 2.0, (9, 100), (1, 1000)),
        _row("cb_s12:test", 6.0, None, None),
        _row("old:test", 1.0, (1, 10), (1, 100)),  # seed 1 counted, seed 2 scored before
        _row("old_s2:test", 1.0, None, None),
        _row("norep:test", 2.0, (0, 0), (3, 100)),  # a split without repeats: no check
    ]
    pooled = {r["system"]: r for r in seed_rows(rows)}
    assert set(pooled) == {"rnnt:test", "rnnt:repeats", "cb:test", "old:test", "norep:test"}
    assert pooled["old:test"]["repeat_deletions"] is None  # not a sum over some seeds
    test = pooled["rnnt:test"]
    assert test["seeds"] == [1, 2, 3] and test["error_rates"] == [4.0, 3.0, 5.0]
    assert test["mean_error_rate"] == pytest.approx(4.0)
    assert (test["repeat_deletions"], test["repeat_tokens"]) == (6, 300)
    assert (test["other_deletions"], test["other_tokens"]) == (20, 3000)
    assert pooled["cb:test"]["seeds"] == [12] and pooled["cb:test"]["repeat_tokens"] is None
    table = seed_table(rows)
    # test: 2.0% of repeats against 2 x 0.67% + 0.5 = 1.83%; repeats: 9% against 0.7%
    assert "| rnnt:test | 1, 2, 3 | 4.00 / 3.00 / 5.00 (4.00) | 6 / 300 (2.0%) |" in table
    assert "no: 2.00 > 1.83 |" in table and "no: 9.00 > 0.70 |" in table
    assert "| cb:test | 12 | 6.00 (6.00) |  |  |  |" in table
    assert "| norep:test | 1 | 2.00 (2.00) | 0 / 0 (0.0%) | 3 / 100 (3.0%) |  |" in table
    rows[3]["repeat_deletions"] = 0
    assert "yes: 0.00 <= 0.70 |" in seed_table(rows)


def test_emission_delays_reach_the_csv_and_a_last_markdown_column(tmp_path, capsys):
    """A decoding with timing.tsv: its score's median and 90th percentile delay become the
    CSV's last columns and the table's last one; a decoding without one leaves them empty."""
    from cbasr.evaluation.delay import write_timing

    refs = {"u1": ["a", "b"], "u2": ["c"]}
    timed = _decoding(tmp_path / "timed", "test", refs, refs=refs, score=False)
    write_timing(timed / "timing.tsv", [("u1", [0.1, 0.2], [0.15, 0.5]), ("u2", [0.3], [0.4])])
    score_decode_dir(timed, bootstrap_samples=20)  # delays 50, 300 and 100 ms
    _decoding(tmp_path / "plain", "test", refs, refs=refs)
    table = tmp_path / "t.csv"
    runs = [str(tmp_path / "timed"), str(tmp_path / "plain"), "--bootstrap", "20"]
    compare.main([*runs, "--csv", str(table)])
    rows = {r["system"]: r for r in csv.DictReader(open(table))}
    assert float(rows["timed:test"]["emission_delay_p50_ms"]) == pytest.approx(100.0)
    assert float(rows["timed:test"]["emission_delay_p90_ms"]) == pytest.approx(260.0)
    assert rows["plain:test"]["emission_delay_p90_ms"] == ""
    capsys.readouterr()
    compare.main(runs)
    head, rule, *lines = capsys.readouterr().out.splitlines()
    assert head.endswith("| emission delay p50 / p90 (ms) |") and rule.count("|") == head.count("|")
    assert lines[0].endswith("| 100 / 260 |") and lines[1].endswith("|  |")
