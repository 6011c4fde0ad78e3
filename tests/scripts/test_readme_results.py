"""scripts/readme_results.py: README's results table is the one generated from results.csv."""

import pytest

from tests.scripts import load_script

COLUMNS = (
    "system,error_rate,ci95_low,ci95_high,sub,del,ins,ref_tokens,utts,parameters,epochs,decode,"
    "rtf,train_minutes"
)


@pytest.fixture(scope="module")
def readme_results():
    return load_script("readme_results")


def test_the_readme_shows_the_generated_table(readme_results):
    readme = (readme_results.ROOT / "README.md").read_text()
    assert readme_results.shown_table(readme) == readme_results.headline_table()


def test_a_row_per_pinned_system_with_a_greedy_test_row(readme_results, tmp_path):
    (tmp_path / "conf").mkdir()
    for name in ["ctc", "cb", "unrun"]:
        (tmp_path / "conf" / f"{name}.yaml").write_text("# a system\n")
    (tmp_path / "results.csv").write_text(
        COLUMNS
        + "\n"
        + "cb:test,3.25,2.5,4.0,1,2,3,100,10,1150000,7,greedy,0.001,8.5\n"
        + "cb:test_beam8,2.5,2.0,3.0,1,1,1,100,10,1150000,7,beam 8,0.002,8.5\n"
        + "ctc:test,4.5,4.0,5.0,1,2,3,100,10,1250000,8,greedy,0.001,9.0\n"
        + "ctc_variant:test,1.0,0.5,1.5,1,0,0,100,10,1250000,8,greedy,0.001,9.0\n"
    )
    lines = readme_results.headline_table(tmp_path).splitlines()
    assert lines[2:] == [
        "| `cb` | 3.25 [2.50, 4.00] | 2.50 | 1.15 M | 7 |",
        "| `ctc` | 4.50 [4.00, 5.00] |  | 1.25 M | 8 |",
    ]


def test_write_replaces_the_table_between_the_markers(readme_results):
    start, end = readme_results.START, readme_results.END
    readme = f"intro\n{start}\n| old |\n{end}\noutro\n"
    updated = readme_results.with_table(readme, "| new |\n")
    assert updated == f"intro\n{start}\n| new |\n{end}\noutro\n"
    assert readme_results.shown_table(updated) == "| new |\n"
