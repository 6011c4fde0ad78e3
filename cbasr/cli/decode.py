"""cbasr-decode: decode splits with a trained experiment into ``<exp>/decode/<split>/``."""

import argparse
import logging
from pathlib import Path

import torch

from cbasr.cli.common import setup_logging
from cbasr.engines.decode import Experiment, decode_split, is_decoded
from cbasr.engines.trainer import select_device

log = logging.getLogger("cbasr-decode")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exp-dir", required=True, type=Path)
    parser.add_argument("--manifest-dir", required=True, type=Path, help="holds <split>.jsonl")
    parser.add_argument("--feature-dir", required=True, type=Path, help="holds <split>/ features")
    parser.add_argument("--splits", nargs="+", default=["dev", "test"])
    parser.add_argument("--checkpoint", default="best", help="best | last | a name in checkpoints/")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--num-threads", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="decode even if outputs are up to date")
    args = parser.parse_args(argv)
    setup_logging()
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    exp = Experiment(args.exp_dir, args.checkpoint, select_device(args.device))
    for split in args.splits:
        out_dir = args.exp_dir / "decode" / split
        if is_decoded(exp, out_dir) and not args.force:
            log.info("%s: already decoded with this checkpoint, skipping (--force to redo)", split)
            continue
        summary = decode_split(exp, args.manifest_dir / f"{split}.jsonl", args.feature_dir / split, out_dir)
        log.info("%s: decoded %d utterances with the %s checkpoint (epoch %d); %d skipped", split,
                 summary["utts"], args.checkpoint, summary["epoch"], summary["skipped"])


if __name__ == "__main__":
    main()
