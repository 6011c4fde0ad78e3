"""cbasr-export: the acoustic model of an experiment as TorchScript or ONNX, with ``<out>.json``.

    cbasr-export --exp-dir exp/blstm_ctc --format onnx --out blstm_ctc.onnx
    cbasr-export --exp-dir exp/cb_pointwise --format torchscript --out cb.pt --checkpoint averaged
    cbasr-export --exp-dir exp/hat --format sherpa-onnx --out hat_sherpa  # a directory

CTC and CB with the pointwise decoder export (their search reads frame-level outputs only);
the exported model is checked against the eager one on a padded batch before it is written.
``--format sherpa-onnx`` writes a model directory for sherpa-onnx instead: CTC, RNN-T and HAT,
with a streaming encoder where the model streams (:mod:`cbasr.inference.sherpa_export`).
"""

import argparse
import logging
from pathlib import Path

import torch

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.inference.experiment import Experiment
from cbasr.inference.export import FORMATS, export_model
from cbasr.inference.sherpa_export import SHERPA_ONNX, export_sherpa

log = logging.getLogger("cbasr-export")


@one_line_errors("cbasr-export")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exp-dir", required=True, type=Path, help="a cbasr-train experiment")
    parser.add_argument("--format", required=True, choices=(*FORMATS, SHERPA_ONNX))
    parser.add_argument(
        "--out", required=True, type=Path, help="the model file (sherpa-onnx: directory) to write"
    )
    parser.add_argument(
        "--checkpoint",
        default="best",
        help="best | last | averaged | a name in checkpoints/ | a .pt file",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=128,
        help="sherpa-onnx: the labels an LSTM prediction network reads (exact below that many)",
    )
    args = parser.parse_args(argv)
    setup_logging()
    torch.set_num_threads(1)
    exp = Experiment(args.exp_dir, args.checkpoint, "cpu")
    if args.format == SHERPA_ONNX:
        description = export_sherpa(exp, args.out, history=args.history)
        log.info(
            "%s: %s model for sherpa-onnx (%s), largest difference from the eager model %.1e; "
            "its feature configuration in %s",
            args.out,
            description["family"],
            ", ".join(description["files"].values()),
            description["max_abs_difference"],
            args.out / description["files"]["features"],
        )
        return
    description = export_model(exp, args.format, args.out)
    log.info(
        "%s: %s model (%s, outputs %s), largest difference from the eager model %.1e; "
        "tokens, features and CMVN in %s.json",
        args.out,
        description["family"],
        args.format,
        ", ".join(description["outputs"]),
        description["max_abs_difference"],
        args.out,
    )


if __name__ == "__main__":
    main()
