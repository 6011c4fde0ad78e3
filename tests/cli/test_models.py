"""cbasr-models: the compatibility table the docs show is the one the code gives."""

import importlib.util
import re
from pathlib import Path

import pytest

from cbasr.cli import models

DOCS = Path(__file__).resolve().parents[2] / "docs"


def docs_generator():
    """``docs/_ext/cbasr_docs.py``, which writes the site's generated parts when it builds."""
    path = DOCS / "_ext" / "cbasr_docs.py"
    spec = importlib.util.spec_from_file_location("cbasr_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def table() -> str:
    """The compatibility table (it composes every preset's config: 2 s), once for the module."""
    return models.compatibility_table()


def test_the_docs_table_is_the_generated_one(table, monkeypatch):
    """docs/concepts.md includes the part the docs build generates, which is this table."""
    generator = docs_generator()
    monkeypatch.setattr(models, "compatibility_table", lambda: table)  # built once, above
    name = "compatibility.md"
    included = re.findall(
        r"```\{include\} _generated/(\S+)\n```", (DOCS / "concepts.md").read_text()
    )
    assert name in included
    text = generator.generated_files()[name]
    shown = re.search(r"<!-- cbasr-models table -->\n(.*?)<!-- end of table -->", text, re.S)
    assert shown.group(1) == table


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
