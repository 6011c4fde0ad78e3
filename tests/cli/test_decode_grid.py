"""cbasr-decode grids: every point decoded and scored on dev, the table written, the best named."""

import json
import shutil

import pytest

from cbasr.cli import decode
from tests.cli.training import decode_args


def test_a_grid_decodes_scores_and_names_the_best(tone_data, trained, tmp_path, capsys):
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    (tmp_path / "uniform.arpa").write_text(
        "\\data\\\nngram 1=7\n\n\\1-grams:\n-0.778 </s>\n-99 <s>\n"
        + "".join(f"-0.778 {t}\n" for t in "abcde")
        + "\n\\end\\\n"
    )
    args = [
        *decode_args(tone_data, exp, "dev"),
        "--beam",
        "4",
        "--lm",
        str(tmp_path / "uniform.arpa"),
    ]
    decode.main(args + ["--lm-weight", "0.2,1.5", "--label-bonus", "0,2"])
    table = (exp / "decode/grid_dev_lm_weight_label_bonus.md").read_text()
    assert table in capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and "%" not in line]
    assert len(rows) == 4
    # each point is its own scored decoding; the table holds their scores, best first
    rates = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        score = json.loads((exp / "decode" / cells[4] / "score.json").read_text())
        assert float(cells[2]) == pytest.approx(score["error_rate"], abs=0.005)
        assert score["settings"]["lm_weight"] == float(cells[0])
        assert score["settings"]["label_bonus"] == float(cells[1])
        rates.append(score["error_rate"])
    assert rates == sorted(rates)
    best = [c.strip() for c in rows[0].strip("|").split("|")]
    assert f"Best on dev: --lm-weight {best[0]} --label-bonus {best[1]}" in table
    # a grid needs a beam for every point, refused before anything is decoded
    with pytest.raises(SystemExit):
        decode.main(args[:-4] + ["--label-bonus", "0,1"])


def test_lm_names_in_decode_directories_keep_all_but_the_file_type():
    from pathlib import Path

    assert decode.lm_name(Path("downloads/lm/3-gram.pruned.1e-7.arpa.gz")) == "3-gram.pruned.1e-7"
    assert decode.lm_name(Path("downloads/lm/3-gram.arpa.gz")) == "3-gram"  # not the same
    assert decode.lm_name(Path("data/wsj_lm/tcb20onp.arpa.gz")) == "tcb20onp"
    assert decode.lm_name(Path("exp/lm_chars")) == "lm_chars"
    assert decode.lm_name(Path("exp/lm/checkpoints/epoch-3.pt")) == "epoch-3"
