"""cbasr-models: the compatibility table the README shows is the one the code gives."""

import re
from pathlib import Path

import pytest

from cbasr.cli import models

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def table() -> str:
    """The compatibility table (it composes every preset's config: 2 s), once for the module."""
    return models.compatibility_table()


def test_readme_table_is_the_generated_one(table):
    text = README.read_text()
    shown = re.search(r"<!-- cbasr-models table -->\n(.*?)<!-- end of table -->", text, re.S).group(
        1
    )
    assert shown == table


def test_table_marks_the_allowed_pairs(table):
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-2]]
        for line in table.splitlines()[2:]
    }
    losses = models.presets("loss")
    allowed = {
        name: [losses[i] for i, mark in enumerate(marks) if mark] for name, marks in rows.items()
    }
    assert allowed["pointwise"] == [
        "cb_marginal",
        "cb_mc",
        "cb_reinforce",
        "cb_reinforce_idb",
        "cb_reinforce_mbb",
        "ctc",
        "forced_suffix",
    ]
    # no MBB: not memoryless (the default estimator falls back to ID-checking)
    assert allowed["autoregressive"] == [
        "cb_mc",
        "cb_reinforce",
        "cb_reinforce_idb",
        "forced_suffix",
    ]
    assert allowed["autoregressive_luo"] == ["forced_suffix"]
    assert allowed["hat"] == ["hat"] and allowed["transducer"] == ["rnnt"]
    assert allowed["monotonic_variable"] == ["cb_marginal"]


def test_params_counts_a_composition(capsys):
    models.main(["params", "encoder=blstm", "decoder=pointwise", "loss=ctc", "--vocab-size", "50"])
    out = capsys.readouterr().out
    # 2 x 128 BLSTM on 3 x 80 stacked inputs, then a 256 -> 50 linear layer
    lstm = 2 * (4 * 128 * (240 + 128) + 8 * 128) + 2 * (4 * 128 * (256 + 128) + 8 * 128)
    assert f"decoder pointwise: {256 * 50 + 50:,}" in out
    assert f"total (CTCModel, loss ctc): {lstm + 256 * 50 + 50:,}" in out


def test_incompatible_pair_names_the_supported_losses():
    with pytest.raises(
        ValueError,
        match=r"cannot train decoder 'transducer' \(joint=hat.*trains with losses \['hat'\]",
    ):
        models.main(["params", "decoder=hat", "loss=ctc"])
