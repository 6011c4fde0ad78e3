"""The weight grid: its points, every point decoded and scored, the table best first."""

import json

import pytest

from cbasr.evaluation.scoring import bootstrap_interval, write_trn
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


# per utterance of ten, errors out of four reference tokens: a spread, so a wide interval
ERRORS = [0, 0, 1, 0, 2, 0, 1, 4, 0, 0]


def _decode_with_errors(tmp_path):
    """A fake decoding: ERRORS (one more per utterance with errors at each 0.2 of LM weight
    away from 0.4) as substitutions."""

    def decode(point):
        extra = round(abs(point["lm_weight"] - 0.4) / 0.2)
        d = tmp_path / f"dev_lm{point['lm_weight']:g}"
        hyps = []
        for (u, r), e in zip(REFS, ERRORS):
            wrong = min(4, e + extra) if e else 0
            hyps.append((u, ["x"] * wrong + r[wrong:]))
        write_trn(d / "ref.trn", REFS)
        write_trn(d / "hyp.trn", hyps)
        return {"dev": d}

    return decode


def test_each_point_carries_its_own_scores_bootstrap_interval(tmp_path):
    """The CI columns are each point's bootstrap interval of its error rate, low then high."""
    results = run_grid(grid_points({"lm_weight": [0.4, 0.6]}), _decode_with_errors(tmp_path))
    dev = results["dev"]
    assert [r.error_rate for r in dev] == [20.0, 27.5]
    for r in dev:
        score = json.loads((tmp_path / r.decoding / "score.json").read_text())
        assert r.ci95 == tuple(score["ci95"]) and r.error_rate == score["error_rate"]
        assert r.ci95[0] < r.error_rate < r.ci95[1]
    extra = [1 if e else 0 for e in ERRORS]
    wrong = [min(4, e + x) for e, x in zip(ERRORS, extra)]
    assert dev[0].ci95 == pytest.approx(bootstrap_interval(ERRORS, [4] * 10))
    assert dev[1].ci95 == pytest.approx(bootstrap_interval(wrong, [4] * 10))
    assert dev[0].ci95 != dev[1].ci95
    report = grid_report("dev", dev, ["lm_weight"], "exp/x")
    for r in dev:
        low, high = r.ci95
        row = f"| {r.point['lm_weight']:g} | {r.error_rate:.2f} | [{low:.2f}, {high:.2f}] |"
        assert f"{row} {r.decoding} |" in report


def test_a_report_row_shows_the_interval_low_then_high():
    results = [
        GridResult({"lm_weight": 0.3, "label_bonus": 1.0}, 4.5, (3.0, 6.25), "dev_beam8_a"),
        GridResult({"lm_weight": 0.5, "label_bonus": 0.0}, 5.0, (3.5, 6.5), "dev_beam8_b"),
    ]
    rows = grid_report("dev", results, ["lm_weight", "label_bonus"], "exp/x").splitlines()[4:6]
    assert rows == [
        "| 0.3 | 1 | 4.50 | [3.00, 6.25] | dev_beam8_a |",
        "| 0.5 | 0 | 5.00 | [3.50, 6.50] | dev_beam8_b |",
    ]


# TIMIT-style scoring map: two 61-phone set phones folded, the glottal stop deleted
TOKEN_MAP = "ix\tih\nax\tah\nq\t\n"
PHONE_REFS = [(f"u{i}", ["ix", "s", "ax", "t"]) for i in range(10)]


def _decode_phones(tmp_path, weight):
    """A fake decoding of phones: at weight 0 every hypothesis is right on the 39 mapped phones
    but has three errors on the 61 (ih for ix, ah for ax, an inserted q); at any other weight
    it has one real substitution (d for t) and nothing else."""

    def decode(point):
        w = point[weight]
        d = tmp_path / f"dev_{weight}{w:g}"
        folded = ["ih", "s", "ah", "t", "q"]
        hyps = [(u, folded if w == 0 else r[:3] + ["d"]) for u, r in PHONE_REFS]
        write_trn(d / "ref.trn", PHONE_REFS)
        write_trn(d / "hyp.trn", hyps)
        return {"dev": d}

    return decode


def test_a_grid_with_a_token_map_ranks_on_the_mapped_tokens(tmp_path):
    """TIMIT: the grid scores and ranks the points on 39 phones, as cbasr-score does."""
    (tmp_path / "map_39.txt").write_text(TOKEN_MAP)
    points = grid_points({"lm_weight": [0.5, 0.0]})
    dev = run_grid(points, _decode_phones(tmp_path, "lm_weight"), tmp_path / "map_39.txt")["dev"]
    assert [(r.point["lm_weight"], r.error_rate) for r in dev] == [(0.0, 0.0), (0.5, 25.0)]
    score = json.loads((tmp_path / "dev_lm_weight0" / "score.json").read_text())
    assert score["token_map"] == str(tmp_path / "map_39.txt") and score["ref_tokens"] == 40
    unmapped = run_grid(points, _decode_phones(tmp_path, "lm_weight"))["dev"]
    assert [(r.point["lm_weight"], r.error_rate) for r in unmapped] == [(0.5, 25.0), (0.0, 75.0)]


def test_cbasr_decode_passes_its_token_map_to_the_grid(tmp_path, monkeypatch):
    """cbasr-decode --token-map: the grid table is ranked on the mapped tokens (the model and
    its decoding faked: only the grid's scoring runs)."""
    from cbasr.cli import decode as decode_cli

    exp, manifests = tmp_path / "exp", tmp_path / "corpus"
    manifests.mkdir()
    (tmp_path / "map_39.txt").write_text(TOKEN_MAP)
    fake = _decode_phones(exp / "decode", "label_bonus")
    monkeypatch.setattr(decode_cli, "Experiment", lambda *args, **kwargs: object())
    monkeypatch.setattr(decode_cli, "_decode", lambda args, *rest: fake(vars(args)))
    decode_cli.main(
        ["--exp-dir", str(exp), "--manifest-dir", str(manifests), "--feature-dir"]
        + [str(tmp_path / "fbank"), "--splits", "dev", "--device", "cpu", "--beam", "2"]
        + ["--label-bonus", "1,0", "--token-map", str(tmp_path / "map_39.txt")]
    )
    table = (exp / "decode" / "grid_dev_label_bonus.md").read_text()
    assert "| 0 | 0.00 | [0.00, 0.00] | dev_label_bonus0 |" in table
    assert "Best on dev: --label-bonus 0 (0.00%)" in table
