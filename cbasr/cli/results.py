"""cbasr-results: one Markdown table of the scored splits of several experiments.

For intervals, paired significance tests, parameters and CSV output use ``cbasr-compare``.
"""

import argparse
import json
import sys
from pathlib import Path

from cbasr.cli.common import one_line_errors
from cbasr.evaluation.compare import describe_settings
from cbasr.evaluation.scoring import check_score_is_current


def results_table(exp_dirs: list[Path]) -> str:
    """A Markdown table with a row per (experiment, scored decoding directory)."""
    lines = [
        "| experiment | split | error rate (%) | 95% CI | sub | del | ins | ref tokens | utts | failed | epoch "
        "| decode |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for exp in exp_dirs:
        for score_file in sorted((exp / "decode").glob("*/score.json")):
            check_score_is_current(score_file.parent)
            s = json.loads(score_file.read_text())
            ci = f"[{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]" if "ci95" in s else ""
            lines.append(
                f"| {exp.name} | {score_file.parent.name} | {s['error_rate']:.2f} | {ci} | {s['sub']} | "
                f"{s['del']} | {s['ins']} | {s['ref_tokens']} | {s['utts']} | "
                f"{_failed(s)} | {s.get('epoch', '')} | {describe_settings(s.get('settings'))} |"
            )
    return "\n".join(lines) + "\n"


@one_line_errors("cbasr-results")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("exp_dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for exp in args.exp_dirs:
        if not exp.is_dir():
            parser.exit(1, f"cbasr-results: {exp} is not an experiment directory\n")
    scored = [exp for exp in args.exp_dirs if any((exp / "decode").glob("*/score.json"))]
    for exp in sorted(set(args.exp_dirs) - set(scored)):
        print(f"cbasr-results: {exp} has no scored decoding yet: left out", file=sys.stderr)
    if not scored:
        parser.exit(1, "cbasr-results: no scored decoding (decode/*/score.json) in any of them\n")
    try:
        print(results_table(scored), end="")
    except ValueError as error:
        parser.exit(1, f"cbasr-results: {error}\n")


def _failed(score: dict) -> str:
    """Failed utterances (scored as empty hypotheses); older decodings left theirs out."""
    left_out = score.get("skipped", 0)
    return f"{score.get('failed', 0)}" + (f" ({left_out} left out)" if left_out else "")


if __name__ == "__main__":
    main()
