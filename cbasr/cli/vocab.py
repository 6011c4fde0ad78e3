"""cbasr-vocab: the token inventory of a training manifest (blank first)."""

import argparse
import logging
from pathlib import Path

from cbasr.cli.common import setup_logging
from cbasr.data.manifest import read_manifest
from cbasr.data.vocab import Vocabulary, tokens_of

log = logging.getLogger("cbasr-vocab")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--manifest", required=True, type=Path, help="training manifest")
    parser.add_argument("--units", default="phones", help="phones | phones_full | chars | words")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--check", nargs="*", type=Path, default=[],
                        help="other manifests whose tokens outside the vocabulary are reported")
    args = parser.parse_args(argv)
    setup_logging()
    vocab = Vocabulary.build(tokens_of(r, args.units) for r in read_manifest(args.manifest))
    vocab.save(args.out)
    log.info("%s: %d tokens + blank from %s", args.out, len(vocab) - 1, args.manifest)
    for other in args.check:
        unknown = {t for r in read_manifest(other) for t in tokens_of(r, args.units) if t not in vocab}
        if unknown:
            log.warning("%s has tokens not seen in training: %s", other, sorted(unknown))


if __name__ == "__main__":
    main()
