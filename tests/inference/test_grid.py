"""The weight grid: its points, every point decoded and scored, the table best first."""

import pytest

from cbasr.evaluation.scoring import write_trn
from cbasr.inference.grid import GridResult, grid_points, grid_report, run_grid

REFS = [(f"u{i}", ["a", "b", "c", "d"]) for i in range(10)]


def test_grid_points_are_every_combination_the_first_weight_slowest():
    points = grid_points({"lm_weight": [0.2, 0.4], "label_bonus": [0.0, 0.5, 1.0]})
    assert len(points) == 6 and points[0] == {"lm_weight": 0.2, "label_bonus": 0.0}
    assert points[3] == {"lm_weight": 0.4, "label_bonus": 0.0}
    assert grid_points({"ilm_weight": [0.3]}) == [{"ilm_weight": 0.3}]
    with pytest.raises(ValueError, match="not a sweepable weight: \\['beam'\\]"):
        grid_points({"beam": [4, 8]})


def test_every_point_is_decoded_and_scored_and_ranked_best_first(tmp_path):
    """A fake decoding whose errors depend on the point: one substitution per utterance for
    each 0.2 the LM weight is away from 0.4 (dev), and none at all on test."""
    decoded = []

    def decode(point):
        decoded.append(point)
        wrong = round(abs(point["lm_weight"] - 0.4) / 0.2)
        dirs = {}
        for split in ("dev", "test"):
            d = tmp_path / f"{split}_lm{point['lm_weight']:g}"
            hyps = [(u, ["x"] * wrong + r[wrong:] if split == "dev" else r) for u, r in REFS]
            write_trn(d / "ref.trn", REFS)
            write_trn(d / "hyp.trn", hyps)
            dirs[split] = d
        return dirs

    points = grid_points({"lm_weight": [0.2, 0.4, 0.6, 0.8]})
    results = run_grid(points, decode)
    assert decoded == points
    dev = results["dev"]
    assert [r.point["lm_weight"] for r in dev] == [0.4, 0.2, 0.6, 0.8]  # a tie: by name
    assert [r.error_rate for r in dev] == [0.0, 25.0, 25.0, 50.0]
    assert dev[1].decoding == "dev_lm0.2" and len(dev[1].ci95) == 2
    assert [r.error_rate for r in results["test"]] == [0.0] * 4
    report = grid_report("dev", dev, ["lm_weight"], "exp/x, beam 8")
    assert report.splitlines()[0] == "Grid on dev (exp/x, beam 8); best first."
    assert "| 0.4 | 0.00 | [0.00, 0.00] | dev_lm0.4 |" in report
    assert "Best on dev: --lm-weight 0.4 (0.00%)" in report


def test_a_report_names_each_swept_option():
    results = [
        GridResult({"lm_weight": 0.3, "label_bonus": 1.0}, 4.5, (3.0, 6.0), "dev_beam8_a"),
        GridResult({"lm_weight": 0.5, "label_bonus": 0.0}, 5.0, (3.5, 6.5), "dev_beam8_b"),
    ]
    report = grid_report("dev", results, ["lm_weight", "label_bonus"], "exp/x")
    assert "| --lm-weight | --label-bonus | error rate (%) | 95% CI | decoding |" in report
    assert "Best on dev: --lm-weight 0.3 --label-bonus 1 (4.50%)" in report
