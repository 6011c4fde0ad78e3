"""scripts/perf_table.py: the performance targets' ratios from benchmark JSON lines."""

import json
from pathlib import Path

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def perf_table():
    return load_script("perf_table")


def _write(path: Path, rows: list[dict], extra: str = "") -> None:
    path.write_text(extra + "".join(json.dumps(r) + "\n" for r in rows))


def _loss(impl, ms, mb, shape=(8, 200, 50, 64)):
    B, T, U, V = shape
    return {"shape": {"B": B, "T": T, "U": U, "V": V}, "implementation": impl, "ms": ms,
            "peak_mb": mb, "device_name": "NVIDIA H200", "commit": "0123456789abcdef"}  # fmt: skip


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "gpu"
    folder.mkdir()
    big = (4, 1000, 200, 1000)
    _write(
        folder / "bench_losses.jsonl",
        [_loss("ctc", 2.0, 10.0), _loss("cb", 1.5, 12.0), _loss("rnnt", 4.0, 40.0),
         _loss("hat_fused", 5.0, 20.0), _loss("ctc", 3.0, 60.0, big), _loss("cb", 3.0, 30.0, big)],
    )  # fmt: skip
    shape = {"B": 32, "T": 1000, "k": 200}
    dist = [
        {"shape": shape, "operation": "log_prob + backward", "implementation": i, "ms": ms}
        for i, ms in (("cbasr", 4.0), ("author", 86.0), ("naive", 900.0))
    ] + [
        {"shape": shape, "operation": "sample", "implementation": i, "ms": ms}
        for i, ms in (("cbasr id_checking", 10.0), ("cbasr bounded", 1.0), ("author", 80.0))
    ]
    # the agreement line bench_distributions prints first carries no measurement
    _write(folder / "bench_distributions.jsonl", [{"float64_max_abs": 1e-14}, *dist])
    _write(
        folder / "bench_train.jsonl",
        [{"preset": p, "frames_per_s": f}
         for p, f in (("blstm_ctc", 1000.0), ("cb_pointwise", 900.0), ("demo_hat", 850.0),
                      ("cb_monotonic", 800.0), ("cb_monotonic_variable", 360.0))],
        extra="a log line\n",
    )  # fmt: skip
    return folder


def test_ratios_against_their_references_and_targets(perf_table, tmp_path):
    found = {(r["quantity"], r["shape"]): r for r in perf_table.ratios(_folder(tmp_path))}
    small, big = "(8, 200, 50, 64)", "(4, 1000, 200, 1000)"
    assert found[("cb / ctc time", small)]["ratio"] == pytest.approx(0.75)
    assert found[("cb / ctc time", small)]["met"] is True
    assert found[("cb / ctc time", big)]["ratio"] == pytest.approx(1.0)  # at the target: met
    assert found[("cb / ctc time", big)]["met"] is True
    assert found[("cb / ctc memory", small)]["met"] is False  # 1.2 > 1.0
    assert found[("hat_fused / rnnt time", small)]["ratio"] == pytest.approx(1.25)
    assert found[("hat_fused / rnnt memory", small)]["met"] is True  # 0.5 <= 0.6
    # no hat_fused or rnnt at the big shape: no row for it
    assert ("hat_fused / rnnt time", big) not in found
    # speed-ups are the author's time over ours, the bounded sampler not mistaken for ours
    speed = found[("CB log_prob + backward: author / ours", "(32, 1000, 200)")]
    assert speed["ratio"] == pytest.approx(21.5) and speed["met"] is True
    sample = found[("CB ID-checking sample: author / ours", "(32, 1000, 200)")]
    assert sample["ours"] == 10.0 and sample["ratio"] == pytest.approx(8.0)
    assert sample["met"] is False
    assert found[("cb_pointwise / blstm_ctc frames/s", "")]["met"] is False  # 0.9 < 1.0
    assert found[("demo_hat / blstm_ctc frames/s", "")]["met"] is True  # 0.85 >= 0.8
    second_order = found[("cb_monotonic_variable / cb_monotonic frames/s", "")]
    assert second_order["ratio"] == pytest.approx(0.45) and second_order["met"] is False
    assert ("cb_monotonic_variable / blstm_ctc frames/s", "") not in found


def test_a_missing_side_or_file_leaves_the_ratio_open(perf_table, tmp_path):
    folder = _folder(tmp_path)
    (folder / "bench_train.jsonl").unlink()
    lines = (folder / "bench_distributions.jsonl").read_text().splitlines()
    (folder / "bench_distributions.jsonl").write_text(
        "\n".join(line for line in lines if '"author"' not in line) + "\n"
    )
    found = perf_table.ratios(folder)
    assert not [r for r in found if "frames/s" in r["quantity"]]
    author = [r for r in found if "author" in r["quantity"]]
    assert len(author) == 2 and all(r["ratio"] is None and r["met"] is None for r in author)
    text = perf_table.table(folder)
    assert "NVIDIA H200, commit 0123456" in text and "| - | ≥ 20 | - |" in text


def test_annotate_tags_every_line_and_drops_the_rest(perf_table, tmp_path):
    path = tmp_path / "bench_train.jsonl"
    _write(path, [{"preset": "blstm_ctc", "frames_per_s": 5.0}], extra="progress\n")
    assert perf_table.main(["--annotate", str(path), "abc", "bench_train --json"]) == 0
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert row["preset"] == "blstm_ctc" and row["frames_per_s"] == 5.0
    assert row["commit"] == "abc" and row["command"] == "bench_train --json"
    assert row["device_name"]


def test_a_broken_line_is_named(perf_table, tmp_path):
    folder = _folder(tmp_path)
    with (folder / "bench_losses.jsonl").open("a") as f:
        f.write('{"shape": \n')
    with pytest.raises(SystemExit, match=r"bench_losses.jsonl:7: not a JSON object"):
        perf_table.ratios(folder)


def test_summary_has_a_row_per_folder(perf_table, tmp_path, capsys):
    first = _folder(tmp_path)
    second = tmp_path / "cpu"
    second.mkdir()
    _write(second / "bench_losses.jsonl", [_loss("ctc", 1.0, 1.0), _loss("cb", 3.0, 1.0)])
    assert perf_table.main(["--summary", str(first), str(second)]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 4 and rows[0].startswith("| machine | commit | cb / ctc time |")
    assert rows[2].split(" | ")[2] == "0.75 / 1"  # both shapes, in the file's order
    assert rows[3].split(" | ")[2] == "3"


def test_every_commit_is_named_and_a_measurement_twice_is_refused(perf_table, tmp_path):
    folder = _folder(tmp_path)
    rows = [{**r, "device_name": "NVIDIA H200", "commit": "fedcba9876"}
            for r in perf_table.read_lines(folder / "bench_train.jsonl")]  # fmt: skip
    _write(folder / "bench_train.jsonl", rows)
    assert perf_table.machine(folder) == ("NVIDIA H200", "0123456, fedcba9")
    with (folder / "bench_losses.jsonl").open("a") as f:
        f.write(json.dumps(_loss("cb", 1.4, 12.0)) + "\n")
    with pytest.raises(SystemExit, match=r"cb at \(8, 200, 50, 64\) is measured twice"):
        perf_table.ratios(folder)


def test_greedy_decoding_lines_give_label_looping_s_speed_up(perf_table, tmp_path):
    """bench_greedy.py's lines, appended to bench_train.jsonl: frame-looping's time over
    label-looping's, per model and batch, against 3; the presets' lines still read."""
    folder = tmp_path / "gpu"
    folder.mkdir()
    greedy = [
        {"greedy": "hat", "batch": 16, "label_looping_ms": 10.0, "frame_looping_ms": 40.0},
        {"greedy": "rnnt", "batch": 64, "label_looping_ms": 20.0, "frame_looping_ms": 30.0},
    ]
    _write(folder / "bench_train.jsonl", [{"preset": "blstm_ctc", "frames_per_s": 100.0}, *greedy])
    rows = {(r["quantity"], r["shape"]): r for r in perf_table.ratios(folder)}
    hat = rows[("hat greedy: label-looping speed-up", "batch 16")]
    rnnt = rows[("rnnt greedy: label-looping speed-up", "batch 64")]
    assert (hat["ratio"], hat["met"]) == (4.0, True)
    assert (rnnt["ratio"], rnnt["met"]) == (1.5, False)
    assert ("cb_pointwise / blstm_ctc frames/s", "") in rows


def test_graphs_and_floor_lines_give_their_ratios(perf_table, tmp_path):
    """A greedy line with CUDA graphs adds their speed-up over frame-looping, with beams the
    device merge's over the host's (against 1); a Conformer line
    of ``bench_train.py --floor`` its frames/s over the minimal loop's, against 0.95."""
    folder = tmp_path / "gpu"
    folder.mkdir()
    lines = [
        {"greedy": "hat", "batch": 16, "label_looping_ms": 10.0, "frame_looping_ms": 40.0,
         "graphs_ms": 5.0},
        {"beam_search": "hat", "batch": 16, "beam4_host_ms": 30.0, "beam4_device_ms": 40.0,
         "beam4_graphs_error": "RuntimeError: ...", "beam8_host_ms": 50.0,
         "beam8_device_ms": 25.0, "beam8_graphs_ms": 5.0},
        {"preset": "ls_conformer_ctc", "frames_per_s": 95.0, "floor_frames_per_s": 100.0},
        {"preset": "ls_conformer_hat", "frames_per_s": 90.0, "floor_frames_per_s": 100.0},
    ]  # fmt: skip
    _write(folder / "bench_train.jsonl", lines)
    rows = {(r["quantity"], r["shape"]): r for r in perf_table.ratios(folder)}
    graphs = rows[("hat greedy: label-looping from CUDA graphs, speed-up", "batch 16")]
    assert (graphs["ratio"], graphs["met"]) == (8.0, True)
    beam4 = rows[("hat beam 4: prefixes on the device, speed-up", "batch 16")]
    beam8 = rows[("hat beam 8: prefixes on the device, speed-up", "batch 16")]
    assert (beam4["ratio"], beam4["met"], beam8["ratio"], beam8["met"]) == (0.75, False, 2.0, True)
    assert rows[("hat beam 8: prefixes from CUDA graphs, speed-up", "batch 16")]["ratio"] == 10.0
    failed = rows[("hat beam 4: prefixes from CUDA graphs, speed-up", "batch 16")]
    assert (failed["ratio"], failed["met"]) == (None, None)  # a failed capture: a row left open
    ctc = rows[("ls_conformer_ctc / minimal loop frames/s", "")]
    hat = rows[("ls_conformer_hat / minimal loop frames/s", "")]
    assert (ctc["ratio"], ctc["met"], hat["ratio"], hat["met"]) == (0.95, True, 0.9, False)


def test_gpu_time_lines_give_wall_over_gpu_time_and_graph_rows_leave_the_eager_ratios(
    perf_table, tmp_path
):
    """``bench_train.py --gpu-time``: each line's mean wall time over its kernels' time per step,
    against 1.2, eager and from CUDA graphs; the frames/s ratios take the eager lines only, and
    a preset that failed (an ``error`` line) gives no ratio."""
    folder = tmp_path / "gpu"
    folder.mkdir()
    lines = [
        {"preset": "blstm_ctc", "frames_per_s": 100.0, "cuda_graphs": False, "wall_ms": 20.0,
         "gpu_ms": 5.0},
        {"preset": "cb_pointwise", "frames_per_s": 90.0, "cuda_graphs": False},
        {"preset": "cb_pointwise", "frames_per_s": 300.0, "cuda_graphs": True, "wall_ms": 5.5,
         "gpu_ms": 5.0},
        {"preset": "demo_hat", "device": "cuda", "error": "trainer.cuda_graphs: cannot be captured"},
    ]  # fmt: skip
    _write(folder / "bench_train.jsonl", lines)
    rows = {r["quantity"]: r for r in perf_table.ratios(folder)}
    eager = rows["blstm_ctc step, eager: wall / GPU time"]
    graphs = rows["cb_pointwise step, CUDA graphs: wall / GPU time"]
    assert (eager["ratio"], eager["met"], eager["target"]) == (4.0, False, "≤ 1.2")
    assert graphs["ratio"] == pytest.approx(1.1) and graphs["met"]
    assert rows["cb_pointwise / blstm_ctc frames/s"]["ratio"] == pytest.approx(0.9)
    assert rows["demo_hat / blstm_ctc frames/s"]["ratio"] is None
    assert not any(q.startswith("demo_hat step") for q in rows)


def _search(criterion, search, beam, rtf, search_s, utts=300):
    return {"search_bench": criterion, "criterion": criterion, "search": search, "beam": beam,
            "rtf": rtf, "search_s": search_s, "utts": utts, "manifest": "data/digits/test.jsonl"}  # fmt: skip


def test_tdt_over_rnnt_at_each_search(perf_table, tmp_path):
    folder = tmp_path / "cpu"
    folder.mkdir()
    _write(
        folder / "bench_search.jsonl",
        [_search("rnnt", "greedy (label-looping)", 0, 0.004, 0.4),
         _search("rnnt", "greedy (frame-looping)", 0, 0.04, 4.0),  # not the reference
         _search("rnnt", "beam 8", 8, 0.010, 1.0), _search("rnnt", "beam 4", 4, 0.001, 0.1),
         _search("tdt", "greedy", 0, 0.003, 0.2), _search("tdt", "beam 8", 8, 0.012, 0.9),
         _search("tdt", "beam 8", 8, 0.001, 0.01, utts=60)],  # no RNN-T on 60 utterances
    )  # fmt: skip
    found = {r["quantity"]: r for r in perf_table.ratios(folder)}
    assert len(found) == 4 and len(perf_table.ratios(folder)) == 4
    greedy = found["tdt / rnnt RTF, greedy"]
    assert greedy["ratio"] == pytest.approx(0.75) and greedy["met"] is False  # > 0.67
    assert greedy["shape"] == "300 utts of test.jsonl" and greedy["target"] == "≤ 0.67"
    search = found["tdt / rnnt search time, greedy"]
    assert search["ratio"] == pytest.approx(0.5) and search["met"] is True
    beam = found["tdt / rnnt RTF, beam 8"]
    assert beam["ratio"] == pytest.approx(1.2) and beam["met"] is False and beam["target"] == "≤ 1"
    assert found["tdt / rnnt search time, beam 8"]["ratio"] == pytest.approx(0.9)


def test_tdt_over_rnnt_reads_the_newest_run_only(perf_table, tmp_path):
    """Two runs on the same utterances (their lines' commands): the later one's TDT against
    its own RNN-T, never against the other run's."""
    folder = tmp_path / "cpu"
    folder.mkdir()
    old = [_search("rnnt", "beam 8", 8, 0.010, 1.0), _search("tdt", "beam 8", 8, 0.012, 1.2)]
    new = [_search("rnnt", "beam 8", 8, 0.020, 2.0), _search("tdt", "beam 8", 8, 0.010, 1.0)]
    for line in old:
        line["command"] = "bench_search.py (first)"
    for line in new:
        line["command"] = "bench_search.py (second)"
    _write(folder / "bench_search.jsonl", old + new)
    found = perf_table.ratios(folder)
    assert [(r["quantity"], r["ratio"]) for r in found] == [
        ("tdt / rnnt RTF, beam 8", pytest.approx(0.5)),
        ("tdt / rnnt search time, beam 8", pytest.approx(0.5)),
    ]
