"""Command line of the toy study: ``python -m cbasr.toy {train,compare,report} --conf F --out D``.

- ``train``: every run of the sweep file (skips runs already written).
- ``compare``: the shared-parameter variance comparison, one file per seed (skips done seeds).
- ``report``: ``D/results.md`` and ``D/plots/*.png``.
"""

import argparse
import sys
from functools import partial
from pathlib import Path

from cbasr.toy.compare import compare_all
from cbasr.toy.report import write_report
from cbasr.toy.sweep import expand_runs, load_sweep, run_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cbasr.toy", description=__doc__.splitlines()[0]
    )
    parser.add_argument("command", choices=["train", "compare", "report"])
    parser.add_argument("--conf", required=True, help="sweep file (JSON)")
    parser.add_argument("--out", required=True, type=Path, help="experiment directory")
    parser.add_argument(
        "--workers", type=int, default=None, help="processes (default: the sweep file's)"
    )
    parser.add_argument("--command-line", default=None, help="command recorded in results.md")
    args = parser.parse_args(argv)
    config = load_sweep(args.conf)
    workers = config.workers if args.workers is None else args.workers
    if args.command == "train":
        run_all(expand_runs(config), args.out, workers, log=partial(print, flush=True))
    elif args.command == "compare":
        compare_all(args.conf, args.out, workers, log=partial(print, flush=True))
    elif _report_is_current(args.conf, args.out):
        print(f"{args.out / 'results.md'} is newer than every result; nothing to do")
    else:
        command = args.command_line or " ".join(["python -m cbasr.toy", *sys.argv[1:]])
        print(f"wrote {write_report(config, args.out, command)}")
    return 0


def _report_is_current(conf: str, out: Path) -> bool:
    """``results.md`` and the plots exist and are newer than the sweep file and every result."""
    outputs = [out / "results.md", out / "plots" / "convergence_base.png"]
    if not all(p.exists() for p in outputs):
        return False
    inputs = [
        Path(conf),
        *(out / "runs").glob("*/*/seed*.json"),
        *(out / "compare").glob("seed*.json"),
    ]
    return min(p.stat().st_mtime for p in outputs) >= max(p.stat().st_mtime for p in inputs)


if __name__ == "__main__":
    sys.exit(main())
