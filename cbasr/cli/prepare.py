"""cbasr-prepare: manifests for a licensed corpus from the user's copy of it.

    cbasr-prepare timit --corpus-dir /data/TIMIT --out data/timit [--phone-set 48|61]
    cbasr-prepare wsj --corpus-dir /data/wsj --out data/wsj
    cbasr-prepare gigaword --corpus-dir /data/gigaword --out data/gigaword

A rerun on a complete output directory with the same options does nothing; an interrupted one
is redone. A directory that is not the corpus fails with what was expected and what was found.
"""

import argparse
import logging
import sys
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.corpora.prepare import CorpusError

log = logging.getLogger("cbasr-prepare")


@one_line_errors("cbasr-prepare")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="corpus", required=True)
    for name in ("timit", "wsj", "gigaword"):
        p = sub.add_parser(name)
        p.add_argument("--corpus-dir", required=True, type=Path)
        p.add_argument("--out", required=True, type=Path)
        p.add_argument(
            "--allow-partial",
            action="store_true",
            help="accept a subset of the corpus (split sizes other than the standard ones)",
        )
        if name == "timit":
            p.add_argument(
                "--phone-set", choices=["61", "48"], default="48", help="training labels"
            )
    args = parser.parse_args(argv)
    setup_logging()
    try:
        if args.corpus == "timit":
            from cbasr.corpora.timit import prepare_timit

            prepare_timit(args.corpus_dir, args.out, args.phone_set, strict=not args.allow_partial)
        elif args.corpus == "wsj":
            from cbasr.corpora.wsj import prepare_wsj

            prepare_wsj(args.corpus_dir, args.out, strict=not args.allow_partial)
        else:
            from cbasr.corpora.gigaword import prepare_gigaword

            prepare_gigaword(args.corpus_dir, args.out, strict=not args.allow_partial)
    except CorpusError as e:
        log.error("%s", e)
        sys.exit(2)


if __name__ == "__main__":
    main()
