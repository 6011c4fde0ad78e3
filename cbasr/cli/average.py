"""cbasr-average: average the weights of an experiment's last or best N epoch checkpoints.

cbasr-average --exp-dir exp/blstm_ctc --last 5            # -> checkpoints/averaged.pt
cbasr-average --exp-dir exp/blstm_ctc --best 3 --name avg-best3
cbasr-decode --exp-dir exp/blstm_ctc --checkpoint averaged ...
"""

import argparse
import json
import logging
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.storage.checkpoint import CheckpointDir
from cbasr.training.averaging import METRICS, average_checkpoints, read_history, select_epochs

log = logging.getLogger("cbasr-average")


@one_line_errors("cbasr-average")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exp-dir", required=True, type=Path)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, help="average the N most recent epoch checkpoints")
    which.add_argument("--best", type=int, help="average the N best epoch checkpoints by --metric")
    parser.add_argument(
        "--metric",
        choices=METRICS,
        help="for --best (default: the experiment's trainer.best_metric)",
    )
    parser.add_argument(
        "--name", default="averaged", help="output checkpoints/<name>.pt (default: averaged)"
    )
    args = parser.parse_args(argv)
    setup_logging()
    checkpoints = CheckpointDir(args.exp_dir / "checkpoints")
    if not checkpoints.path.is_dir():
        parser.error(f"{checkpoints.path} not found: has {args.exp_dir} been trained?")
    metric = args.metric
    if metric is None:
        config = args.exp_dir / "config.json"
        metric = (
            json.loads(config.read_text())["trainer"].get("best_metric", METRICS[0])
            if config.is_file()
            else METRICS[0]
        )
    history = read_history(args.exp_dir) if args.best is not None else []
    try:
        epochs = select_epochs(checkpoints, history, last=args.last, best=args.best, metric=metric)
        path = average_checkpoints(args.exp_dir, epochs, args.name)
    except ValueError as e:
        parser.error(str(e))
    chosen = f"last {args.last}" if args.last is not None else f"best {args.best} by {metric}"
    log.info("%s: epochs %s (%s) -> %s", args.exp_dir, epochs, chosen, path)


if __name__ == "__main__":
    main()
