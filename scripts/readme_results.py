"""README's headline results table, generated from the synth recipe's ``results.csv``.

    .venv/bin/python scripts/readme_results.py           # print the table
    .venv/bin/python scripts/readme_results.py --write   # put it into README.md, between its markers

One row per pinned system of the synth recipe (``recipes/synth/conf/<system>.yaml``) that
``results.csv`` holds (``cbasr-compare --csv``: the experiment ``exp/<system>``): its test phone
error rate greedily, with the 95% bootstrap interval, and with beam 8, its parameters and
epochs. ``tests/scripts/test_readme_results.py`` checks that README.md shows the
table this prints.
"""

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "synth"
START = "<!-- results -->"
END = "<!-- end of results -->"


def headline_table(recipe: Path = RECIPE) -> str:
    """The Markdown table: a row per pinned system with a greedy test row in ``results.csv``."""
    with open(recipe / "results.csv", newline="") as f:
        rows = {row["system"]: row for row in csv.DictReader(f)}
    systems = sorted(p.stem for p in (recipe / "conf").glob("*.yaml"))
    lines = [
        "| system | test PER % greedy [95% CI] | beam 8 | parameters | epochs |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in systems:
        greedy, beam = rows.get(f"{name}:test"), rows.get(f"{name}:test_beam8")
        if greedy is None:
            continue
        low, high = float(greedy["ci95_low"]), float(greedy["ci95_high"])
        beam_cell = f"{float(beam['error_rate']):.2f}" if beam else ""
        lines.append(
            f"| `{name}` | {float(greedy['error_rate']):.2f} [{low:.2f}, {high:.2f}] | {beam_cell} | "
            f"{int(greedy['parameters']) / 1e6:.2f} M | {greedy['epochs']} |"
        )
    return "\n".join(lines) + "\n"


def shown_table(readme: str) -> str:
    """The table between README's markers."""
    start, end = readme.index(START) + len(START), readme.index(END)
    return readme[start:end].strip("\n") + "\n"


def with_table(readme: str, table: str) -> str:
    """``readme`` with the table between its markers replaced by ``table``."""
    start, end = readme.index(START) + len(START), readme.index(END)
    return readme[:start] + "\n" + table + readme[end:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="update README.md's table")
    args = parser.parse_args(argv)
    table = headline_table()
    if args.write:
        path = ROOT / "README.md"
        path.write_text(with_table(path.read_text(), table))
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
