"""cbasr-features: log-mel filterbanks for every split of a manifest directory, and CMVN."""

import argparse
import logging
import time
from pathlib import Path

from cbasr.cli.common import setup_logging
from cbasr.data.features import FbankOptions, extract_split, write_cmvn

log = logging.getLogger("cbasr-features")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--manifest-dir", required=True, type=Path, help="holds <split>.jsonl")
    parser.add_argument("--out", required=True, type=Path, help="feature directory to write")
    parser.add_argument("--splits", nargs="+", default=["train", "dev", "test"],
                        help="splits to process; the first one provides the CMVN statistics")
    parser.add_argument("--num-mel-bins", type=int, default=80)
    parser.add_argument("--deltas", type=int, choices=[0, 1, 2], default=0,
                        help="append deltas (1) or deltas and delta-deltas (2)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (0: none)")
    args = parser.parse_args(argv)
    setup_logging()
    opts = FbankOptions(num_mel_bins=args.num_mel_bins, deltas=args.deltas)
    for i, split in enumerate(args.splits):
        start = time.monotonic()
        summary = extract_split(args.manifest_dir / f"{split}.jsonl", args.out / split, opts,
                                workers=args.workers, accumulate_stats=(i == 0))
        if i == 0:
            write_cmvn(summary, args.out / "cmvn.json")
        log.info("%s: %d utterances, %d frames, %d skipped (%.1f s)", split, summary["kept"],
                 summary["frames"], summary["skipped"], time.monotonic() - start)


if __name__ == "__main__":
    main()
