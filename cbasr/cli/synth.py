"""cbasr-synth: generate the synthetic eSpeak corpus (audio, manifests, phone inventories).

Example::

    cbasr-synth --out data/synth --size default --workers 2

A rerun with the same parameters on a complete directory does nothing; different
parameters or an incomplete directory regenerate it.
"""

import argparse
import dataclasses
import os
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.corpora.synth.corpus import SIZES, make_corpus

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, type=Path, help="corpus directory to write")
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="default",
        help="preset sizes; the options below override them",
    )
    for split in ("train", "dev", "test"):
        parser.add_argument(
            f"--{split}-speakers", type=int, metavar="N", help=f"speakers in {split}"
        )
        parser.add_argument(
            f"--{split}-utts-per-speaker",
            type=int,
            metavar="N",
            help=f"utterances per {split} speaker",
        )
    parser.add_argument(
        "--utts-per-speaker",
        type=int,
        metavar="N",
        help="utterances per speaker in every split (the per-split options win)",
    )
    parser.add_argument(
        "--seed", type=int, metavar="S", help="seed for speakers, sentences and eSpeak's noise"
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        default=min(4, os.cpu_count() or 1),
        help="synthesis processes (1: synthesize in this process); the output does not "
        "depend on it",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


@one_line_errors("cbasr-synth")
def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    overrides = {}
    for split in ("train", "dev", "test"):
        speakers = getattr(args, f"{split}_speakers")
        utts = getattr(args, f"{split}_utts_per_speaker")
        if speakers is not None:
            overrides[f"{split}_speakers"] = speakers
        if utts is not None or args.utts_per_speaker is not None:
            overrides[f"{split}_utts_per_speaker"] = (
                utts if utts is not None else args.utts_per_speaker
            )
    if args.seed is not None:
        overrides["seed"] = args.seed
    try:
        config = dataclasses.replace(SIZES[args.size], **overrides)
    except ValueError as error:
        parser.error(str(error))
    make_corpus(args.out, config, workers=args.workers)


if __name__ == "__main__":
    main()
