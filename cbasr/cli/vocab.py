"""cbasr-vocab: the token inventory of a training manifest (blank first)."""

import argparse
import logging
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.data.manifest import read_manifest
from cbasr.data.vocab import Vocabulary, tokens_of, train_sentencepiece

log = logging.getLogger("cbasr-vocab")


@one_line_errors("cbasr-vocab")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--manifest", required=True, type=Path, help="training manifest")
    parser.add_argument(
        "--units",
        default="phones",
        help="phones | phones_full | chars | words | sp (train a sentencepiece model) | sp:<model>",
    )
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--check",
        nargs="*",
        type=Path,
        default=[],
        help="other manifests whose tokens outside the vocabulary are reported",
    )
    parser.add_argument(
        "--field", default="words", help="text field for word/char/piece units (source: input side)"
    )
    parser.add_argument(
        "--sp-size",
        type=int,
        default=0,
        help="with --units sp: train a sentencepiece model of this many pieces, written "
        "next to --out as <out>.model; use units sp:<that file> in the data config",
    )
    parser.add_argument(
        "--inventory",
        type=Path,
        help="take the token list from this file (one per line, e.g. a corpus's phone set) "
        "instead of the tokens seen in training; training tokens outside it are an error",
    )
    args = parser.parse_args(argv)
    setup_logging()
    records = read_manifest(args.manifest)
    if args.units == "sp":
        if args.sp_size <= 0:
            parser.error("--units sp needs --sp-size N (the number of pieces)")
        model = train_sentencepiece(
            (r[args.field] for r in records), args.out.with_suffix(""), args.sp_size
        )
        args.units = f"sp:{model}"
        log.info("sentencepiece model %s (%d pieces); units: %s", model, args.sp_size, args.units)
    vocab = Vocabulary.build(tokens_of(r, args.units, args.field) for r in records)
    if args.inventory is not None:
        listed = Vocabulary([t for t in args.inventory.read_text(encoding="utf-8").split() if t])
        outside = sorted({t for t in vocab.tokens[1:] if t not in listed})
        if outside:
            parser.error(
                f"{args.manifest} has tokens outside --inventory {args.inventory}: {outside}"
            )
        vocab = listed
    vocab.save(args.out)
    log.info("%s: %d tokens + blank from %s", args.out, len(vocab) - 1, args.manifest)
    for other in args.check:
        unknown = {
            t
            for r in read_manifest(other)
            for t in tokens_of(r, args.units, args.field)
            if t not in vocab
        }
        if unknown:
            log.warning("%s has tokens not seen in training: %s", other, sorted(unknown))


if __name__ == "__main__":
    main()
