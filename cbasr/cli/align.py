"""cbasr-align: forced alignments of reference transcripts into ``<exp>/align/<split>/``.

    cbasr-align --exp-dir exp/cb_pointwise --manifest-dir data/synth --feature-dir data/fbank --splits dev

Writes ``align.ctm`` (``utt channel start duration token``), ``alignment.json`` (method,
frame period, mean absolute onset error against the manifest's gold ``phone_starts`` and the
share within 20 ms) and, for CB models, ``posteriors_<utt>.png``: ``P(t_l = t | y)`` with the
Viterbi and gold times of one utterance (``--plot-utt``; default the first with gold times).
"""

import argparse
import logging
from pathlib import Path

import torch

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.devices import select_device
from cbasr.inference.alignment import align_split
from cbasr.inference.experiment import Experiment

log = logging.getLogger("cbasr-align")


@one_line_errors("cbasr-align")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exp-dir", required=True, type=Path)
    parser.add_argument("--manifest-dir", required=True, type=Path, help="holds <split>.jsonl")
    parser.add_argument("--feature-dir", required=True, type=Path, help="holds <split>/ features")
    parser.add_argument("--splits", nargs="+", default=["dev"])
    parser.add_argument("--checkpoint", default="best", help="best | last | a name in checkpoints/")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--num-threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: searches are many small operations, which two "
        "threads slow down on a busy CPU; 0: torch's default)",
    )
    parser.add_argument("--plot-utt", default=None, help="utterance whose CB posteriors to plot")
    args = parser.parse_args(argv)
    setup_logging()
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    exp = Experiment(args.exp_dir, args.checkpoint, select_device(args.device))
    for split in args.splits:
        try:
            s = align_split(
                exp,
                args.manifest_dir / f"{split}.jsonl",
                args.feature_dir / split,
                args.exp_dir / "align" / split,
                plot_utt=args.plot_utt,
            )
        except (ValueError, TypeError) as e:
            raise SystemExit(f"cbasr-align: {args.exp_dir}: {e}") from None
        if s["mean_abs_onset_error_ms"] is None:
            log.info(
                "%s: aligned %d utterances (%s), %d skipped; no gold times to compare with",
                split,
                s["utts"],
                s["method"],
                s["skipped"],
            )
        else:
            log.info(
                "%s: aligned %d utterances (%s), %d skipped; onset error %.1f ms mean, %.1f%% within 20 ms "
                "(%d labels; frame period %.0f ms)",
                split,
                s["utts"],
                s["method"],
                s["skipped"],
                s["mean_abs_onset_error_ms"],
                100 * s["within_20ms"],
                s["labels_with_gold"],
                1000 * s["frame_period"],
            )


if __name__ == "__main__":
    main()
