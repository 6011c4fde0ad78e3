"""cbasr-compare: one table across experiment directories, with bootstrap intervals and a
paired significance test between two chosen systems.

    cbasr-compare exp/blstm_ctc exp/cb_pointwise                       # every decoding of each
    cbasr-compare exp/a exp/b --decodes test test_beam8 --csv cmp.csv  # chosen decodings, and CSV
    cbasr-compare exp/c --decodes test --csv cmp.csv --update  # exp/c's rows replaced or added
    cbasr-compare exp/a exp/b --pair a b                               # a:<d> vs b:<d> for each shared <d>
    cbasr-compare exp/a --pair a:test a:test_beam8                     # two decodings of one experiment
    cbasr-compare exp/a exp/b --repeats      # with the deletions of repeated and other tokens
    cbasr-compare exp/rnnt exp/rnnt_s2 exp/rnnt_s3 --decodes test --seeds   # pooled over seeds

A system is ``<experiment>:<decode dir>``; the table shows its error rate with a 95%
bootstrap interval over utterances, S/D/I, parameters, epochs and decode settings (with
``--repeats``, the deletions of reference tokens that repeat their predecessor and of the
others, as ``cbasr-score`` counts them; the CSV always has them). The paired
test resamples the utterances both systems decoded (paired bootstrap, two-sided p-value) and
adds an exact sign test over utterances.
"""

import argparse
import sys
from pathlib import Path

from cbasr.cli.common import one_line_errors
from cbasr.evaluation.compare import (
    collect_systems,
    comparison_rows,
    csv_table,
    find_systems,
    markdown_table,
    merge_csv,
    paired_comparison,
    seed_table,
)
from cbasr.storage.files import write_text


def checkpoint_parameters(path: Path) -> int:
    """A checkpoint file's parameter count (for decodings older than ``decode.json``'s record)."""
    from cbasr.storage.checkpoint import load_checkpoint  # torch: only for such decodings

    return sum(v.numel() for v in load_checkpoint(path)["model"].values())


def _pairs(systems, first: str, second: str):
    a, b = find_systems(systems, first), find_systems(systems, second)
    if len(a) == 1 and len(b) == 1:
        return [(a[0], b[0])]
    by_decode = {s.label.rpartition(":")[2]: s for s in b}
    pairs = [
        (s, by_decode[s.label.rpartition(":")[2]])
        for s in a
        if s.label.rpartition(":")[2] in by_decode
    ]
    if not pairs:
        raise ValueError(f"{first} and {second} have no decoding in common")
    return pairs


def paired_table(results: list[dict]) -> str:
    lines = [
        "| A | B | utts | A (%) | B (%) | A - B | 95% CI of A - B | p (paired bootstrap) | A better / B better "
        "(utts) | p (sign test) |",
        "|---|---|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in results:
        boot, sign = r["bootstrap"], r["sign_test"]
        lines.append(
            f"| {r['a']} | {r['b']} | {r['utts']} | {r['error_rate_a']:.2f} | {r['error_rate_b']:.2f} | "
            f"{boot['difference']:+.2f} | [{boot['ci95'][0]:+.2f}, {boot['ci95'][1]:+.2f}] | "
            f"{boot['p_value']:.4f} | {sign['a_better']} / {sign['b_better']} | {sign['p_value']:.4f} |"
        )
    return "\n".join(lines) + "\n"


@one_line_errors("cbasr-compare")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("exp_dirs", nargs="+", type=Path)
    parser.add_argument(
        "--decodes", nargs="+", default=None, help="decode directories to show (default: all)"
    )
    parser.add_argument("--csv", type=Path, default=None, help="also write the table as CSV here")
    parser.add_argument(
        "--update",
        action="store_true",
        help="merge into an existing --csv: these experiments' rows replace theirs, the other "
        "experiments' rows are kept (a table grown over several runs or machines)",
    )
    parser.add_argument(
        "--pair",
        nargs=2,
        metavar=("A", "B"),
        default=None,
        help="paired test: two systems (exp:decode), or two experiments (every shared decode)",
    )
    parser.add_argument(
        "--repeats",
        action="store_true",
        help="two more columns: deletions of reference tokens that repeat their predecessor, "
        "and of the others (deleted / tokens)",
    )
    parser.add_argument(
        "--seeds",
        action="store_true",
        help="pool the seeds: X, X_s2, X_s3 ... of each decoding in one row (each seed's error "
        "rate, their mean, deletions summed), with the digits recipe's repeat check",
    )
    parser.add_argument("--bootstrap", type=int, default=1000, help="replicates for the intervals")
    parser.add_argument(
        "--paired-bootstrap", type=int, default=10000, help="replicates for the paired test"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        systems = collect_systems(args.exp_dirs, args.decodes, checkpoint_parameters)
        if not systems:
            raise ValueError(f"no decoding found in {[str(e) for e in args.exp_dirs]}")
        rows = comparison_rows(systems, args.bootstrap, args.seed)
        out = seed_table(rows) if args.seeds else markdown_table(rows, repeats=args.repeats)
        if args.pair:
            results = [
                paired_comparison(a, b, args.paired_bootstrap, args.seed)
                for a, b in _pairs(systems, *args.pair)
            ]
            out += "\n" + paired_table(results)
    except (ValueError, FileNotFoundError) as e:
        print(f"cbasr-compare: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(out, end="")
    if args.csv is not None:
        if args.update and args.csv.is_file():
            write_text(args.csv, merge_csv(args.csv.read_text(encoding="utf-8"), rows))
        else:
            write_text(args.csv, csv_table(rows))


if __name__ == "__main__":
    main()
