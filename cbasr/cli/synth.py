"""cbasr-synth: generate a synthetic eSpeak corpus (audio, manifests, inventories).

Two profiles: ``sentences`` (the default), English sentences with gold phone times
(cbasr.corpora.synth.corpus), and ``digits``, connected digit strings in noise and
reverberation with gold word times (cbasr.corpora.synth.digits). Examples::

    cbasr-synth --out data/synth --size default --workers 2
    cbasr-synth --profile digits --out data/digits --snr-db 0 20

A rerun with the same parameters on a complete directory does nothing; different
parameters or an incomplete directory regenerate it.
"""

import argparse
import dataclasses
import os
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.corpora.synth.corpus import SIZES, make_corpus
from cbasr.corpora.synth.digits import (
    DIGITS_SIZES,
    REPEAT_PROSODIES,
    TRAIN_REPEATS,
    make_digits_corpus,
)

__all__ = ["main"]

# profile -> (preset sizes, generator); both profiles have the sizes "default" and "tiny"
_PROFILES = {
    "sentences": (SIZES, make_corpus),
    "digits": (DIGITS_SIZES, make_digits_corpus),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, type=Path, help="corpus directory to write")
    parser.add_argument(
        "--profile",
        choices=sorted(_PROFILES),
        default="sentences",
        help="sentences with gold phone times, or connected digits in noise with gold word times",
    )
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="default",
        help="the profile's preset sizes; the options below override them",
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
        "--snr-db",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="digits: the range of the additive noise's SNR in dB (default 5 25)",
    )
    parser.add_argument(
        "--reverb-share",
        type=float,
        metavar="P",
        help="digits: the share of utterances with reverberation (default 0.5)",
    )
    parser.add_argument(
        "--repeats-utts-per-speaker",
        type=int,
        metavar="N",
        help="digits: utterances of the repeats split per test speaker (default 15; 0: none)",
    )
    parser.add_argument(
        "--repeat-prosody",
        choices=REPEAT_PROSODIES,
        help="digits, repeats split: a repeated word said exactly as its predecessor (same, "
        "the default) or with prosody of its own (drawn)",
    )
    parser.add_argument(
        "--repeat-gap-ms",
        type=int,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="digits, repeats split: the range of the gap before a repeated word (default 50 300)",
    )
    parser.add_argument(
        "--train-repeats",
        choices=TRAIN_REPEATS,
        help="digits: natural (the default: train words drawn independently, about one in ten "
        "repeats its predecessor) or none (no train word repeats its predecessor: a transducer "
        "then learns that a word never follows itself)",
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
    digits_only = {
        "--snr-db": args.snr_db,
        "--reverb-share": args.reverb_share,
        "--repeats-utts-per-speaker": args.repeats_utts_per_speaker,
        "--repeat-prosody": args.repeat_prosody,
        "--repeat-gap-ms": args.repeat_gap_ms,
        "--train-repeats": args.train_repeats,
    }
    if args.profile == "digits":
        if args.snr_db is not None:
            overrides["min_snr_db"], overrides["max_snr_db"] = args.snr_db
        if args.reverb_share is not None:
            overrides["reverb_share"] = args.reverb_share
        if args.repeats_utts_per_speaker is not None:
            overrides["repeats_utts_per_speaker"] = args.repeats_utts_per_speaker
        if args.repeat_prosody is not None:
            overrides["repeat_prosody"] = args.repeat_prosody
        if args.repeat_gap_ms is not None:
            overrides["min_repeat_gap_ms"], overrides["max_repeat_gap_ms"] = args.repeat_gap_ms
        if args.train_repeats is not None:
            overrides["train_repeats"] = args.train_repeats
    elif given := [flag for flag, value in digits_only.items() if value is not None]:
        parser.error(f"{' and '.join(given)} need --profile digits")
    sizes, make = _PROFILES[args.profile]
    try:
        config = dataclasses.replace(sizes[args.size], **overrides)
    except ValueError as error:
        parser.error(str(error))
    make(args.out, config, workers=args.workers)


if __name__ == "__main__":
    main()
