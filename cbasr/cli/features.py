"""cbasr-features: log-mel filterbanks for every split of a manifest directory, and CMVN."""

import argparse
import logging
import time
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.data.features import FbankOptions, FeaturePool, extract_split, write_cmvn
from cbasr.data.source_tokens import SOURCE_VOCAB, extract_source_tokens, source_vocabulary
from cbasr.storage.files import write_text

log = logging.getLogger("cbasr-features")


@one_line_errors("cbasr-features")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--manifest-dir", required=True, type=Path, help="holds <split>.jsonl")
    parser.add_argument("--out", required=True, type=Path, help="feature directory to write")
    parser.add_argument(
        "--splits",
        nargs="+",
        default=["train", "dev", "test"],
        help="splits to process; the first one provides the CMVN statistics",
    )
    parser.add_argument("--num-mel-bins", type=int, default=80)
    parser.add_argument(
        "--deltas",
        type=int,
        choices=[0, 1, 2],
        default=0,
        help="append deltas (1) or deltas and delta-deltas (2)",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (0: none)")
    parser.add_argument(
        "--source-units",
        metavar="UNITS",
        help="text input instead of audio: store the ids of each utterance's 'source' "
        "text in these units (words, chars, sp:<model>) under a source vocabulary built "
        "from the first split",
    )
    parser.add_argument(
        "--source-vocab-size",
        type=int,
        default=0,
        help="keep the most frequent source tokens only, <pad> and <unk> included (0: all)",
    )
    args = parser.parse_args(argv)
    setup_logging()
    if args.source_units:
        _source_tokens(args)
        return
    opts = FbankOptions(num_mel_bins=args.num_mel_bins, deltas=args.deltas)
    with FeaturePool(args.workers) as pool:  # one set of workers for every split
        for i, split in enumerate(args.splits):
            start = time.monotonic()
            summary = extract_split(
                args.manifest_dir / f"{split}.jsonl",
                args.out / split,
                opts,
                workers=args.workers,
                accumulate_stats=(i == 0),
                pool=pool,
            )
            if i == 0:
                write_cmvn(summary, args.out / "cmvn.json")
            log.info(
                "%s: %d utterances, %d frames, %d skipped (%.1f s)",
                split,
                summary["kept"],
                summary["frames"],
                summary["skipped"],
                time.monotonic() - start,
            )


def _source_tokens(args) -> None:
    """Source ids of a text-to-text corpus, with the source vocabulary of the first split."""
    vocab_path = args.out / SOURCE_VOCAB
    vocab = source_vocabulary(
        args.manifest_dir / f"{args.splits[0]}.jsonl", args.source_units, args.source_vocab_size
    )
    write_text(vocab_path, "".join(t + "\n" for t in vocab))
    for split in args.splits:
        summary = extract_source_tokens(
            args.manifest_dir / f"{split}.jsonl", args.out / split, args.source_units, vocab
        )
        log.info(
            "%s: %d utterances, %d source tokens (%d outside the %d-token vocabulary)",
            split,
            summary["kept"],
            summary["frames"],
            summary["unknown"],
            len(vocab),
        )


if __name__ == "__main__":
    main()
