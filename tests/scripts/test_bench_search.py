"""scripts/bench_search.py: the JSON lines it appends are the rows perf_table.py reads, and
its random models are calibrated to emit about as many labels as the references have."""

import json
import sys

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    bench = load_script("bench_search")
    out = tmp_path_factory.mktemp("bench") / "bench_search.jsonl"
    out.write_text('{"search_bench": "an earlier run"}\n')  # --json appends
    argv = ["bench_search.py", "--random", "2", "--models", "rnnt", "tdt", "cb_pointwise"]
    argv += ["--beams", "2", "--json", str(out)]
    saved, sys.argv = sys.argv, argv
    try:
        bench.main()
    finally:
        sys.argv = saved
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == {"search_bench": "an earlier run"}
    return [json.loads(line) for line in lines[1:]]


def test_a_line_per_model_and_search(rows):
    assert [(r["search_bench"], r["search"], r["beam"]) for r in rows] == [
        ("rnnt", "greedy (label-looping)", 0),
        ("rnnt", "greedy (frame-looping)", 0),
        ("rnnt", "beam 2", 2),
        ("tdt", "greedy", 0),
        ("tdt", "beam 2", 2),
        ("cb_pointwise", "greedy", 0),
        ("cb_pointwise", "beam 2 (frame)", 2),
    ]
    assert [r["criterion"] for r in rows] == ["rnnt"] * 3 + ["tdt"] * 2 + ["cb_marginal"] * 2
    for r in rows:
        assert r["utts"] == 2 and r["threads"] == 1 and r["manifest"] == "random features"
        assert r["rtf"] == pytest.approx(r["decode_s"] / r["audio_s"], rel=0.02, abs=1e-5)
        assert r["search_s"] == pytest.approx(r["decode_s"] - r["encoder_s"], abs=2e-4)


def test_each_random_model_greedily_emits_about_the_references_labels(rows):
    greedy = {r["search_bench"]: r["labels_per_ref"] for r in rows if r["beam"] == 0}
    assert set(greedy) == {"rnnt", "tdt", "cb_pointwise"}
    for name, rate in greedy.items():
        assert 0.8 <= rate <= 1.25, name


def test_perf_table_reads_the_lines(rows, tmp_path):
    perf = load_script("perf_table")
    (tmp_path / "bench_search.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = {r["quantity"]: r["ratio"] for r in perf.ratios(tmp_path)}
    rtf = {(r["search_bench"], r["search"]): r["rtf"] for r in rows}
    greedy = rtf["tdt", "greedy"] / rtf["rnnt", "greedy (label-looping)"]
    assert found["tdt / rnnt RTF, greedy"] == pytest.approx(greedy)
    assert found["tdt / rnnt RTF, beam 2"] == pytest.approx(
        rtf["tdt", "beam 2"] / rtf["rnnt", "beam 2"]
    )


def test_rounds_report_one_line_per_model_and_search(tmp_path, monkeypatch):
    """``--rounds 3``: each (model, search) timed three times, one line with the medians."""
    bench = load_script("bench_search")
    out = tmp_path / "bench_search.jsonl"
    calls = []
    real = bench.beam_search
    monkeypatch.setattr(bench, "beam_search", lambda *a, **k: calls.append(1) or real(*a, **k))
    argv = ["bench_search.py", "--random", "2", "--models", "tdt", "--beams", "2"]
    monkeypatch.setattr(sys, "argv", argv + ["--rounds", "3", "--json", str(out)])
    bench.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["search"], r["rounds"]) for r in rows] == [("greedy", 3), ("beam 2", 3)]
    batches = len(calls) // 3
    assert batches >= 1 and len(calls) == 3 * batches  # the beam search ran in each round
