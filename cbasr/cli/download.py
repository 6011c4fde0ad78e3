"""cbasr-download: a freely distributed corpus from its official site (or a mirror), checked.

    cbasr-download librispeech --out downloads --subsets train-clean-5 dev-clean-2
    cbasr-download librispeech --out downloads --subsets train-clean-100 dev-clean test-clean \\
        --mirror https://openslr.elda.org/resources
    cbasr-download librispeech --out downloads --lm-files 3-gram.pruned.1e-7.arpa.gz
    cbasr-download speechocean762 --out downloads [--mirror https://openslr.elda.org/resources]

Archives are checked against their published checksums (LibriSpeech: SHA-256; Mini
LibriSpeech: MD5; the LM files and speechocean762, which have none, as gzip streams), resumed
after an interruption and unpacked into ``OUT/LibriSpeech`` (``OUT/speechocean762``); a subset
already unpacked there, or an archive already checked, is not fetched again. ``--mirror URL`` replaces
``https://www.openslr.org/resources`` (same layout: ``URL/12/dev-clean.tar.gz``);
``--sums FILE`` (``sha256sum``/``md5sum`` output) replaces the published sums for a mirror
that repacked the archives.
"""

import argparse
import logging
import sys
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.corpora.download import DownloadError, fetch
from cbasr.corpora.librispeech import LM_FILES, SUBSETS, download_librispeech, lm_remote
from cbasr.corpora.prepare import CorpusError

log = logging.getLogger("cbasr-download")


def read_sums(path: Path) -> dict[str, str]:
    """``{file name: hex digest}`` from ``sha256sum`` / ``md5sum`` output."""
    sums = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        digest = parts[0].lower()
        hexadecimal = all(c in "0123456789abcdef" for c in digest)
        if len(parts) != 2 or len(digest) not in (32, 64) or not hexadecimal:
            raise SystemExit(f"cbasr-download: {path}:{lineno}: expected '<md5 or sha256>  <file>'")
        sums[Path(parts[1].lstrip("*")).name] = digest
    return sums


@one_line_errors("cbasr-download")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="corpus", required=True)
    p = sub.add_parser("librispeech")
    p.add_argument(
        "--out", required=True, type=Path, help="archives here, the tree in OUT/LibriSpeech"
    )
    p.add_argument("--subsets", nargs="*", default=[], choices=list(SUBSETS), metavar="SUBSET")
    p.add_argument("--lm-files", nargs="*", default=[], choices=list(LM_FILES), metavar="FILE")
    p.add_argument("--mirror", help="base URL in place of https://www.openslr.org/resources")
    p.add_argument("--sums", type=Path, help="checksums in place of the published ones")
    p.add_argument(
        "--remove-archives", action="store_true", help="delete each archive once it is unpacked"
    )
    so = sub.add_parser("speechocean762")
    so.add_argument("--out", required=True, type=Path, help="the tree in OUT/speechocean762")
    so.add_argument("--mirror", help="base URL in place of https://www.openslr.org/resources")
    args = parser.parse_args(argv)
    setup_logging()
    if args.corpus == "speechocean762":
        from cbasr.corpora.speechocean762 import download_speechocean762

        try:
            log.info("%s", download_speechocean762(args.out, args.mirror))
        except (DownloadError, CorpusError) as e:
            log.error("%s", e)
            sys.exit(2)
        return
    if not args.subsets and not args.lm_files:
        parser.error("name --subsets or --lm-files")
    sums = read_sums(args.sums) if args.sums else None
    try:
        if args.subsets:
            tree = download_librispeech(
                args.subsets, args.out, args.mirror, sums, keep_archives=not args.remove_archives
            )
            log.info("%s: %s", tree, ", ".join(args.subsets))
        for name in args.lm_files:
            log.info("%s", fetch(lm_remote(name, args.mirror), args.out / "lm"))
    except (DownloadError, CorpusError) as e:
        log.error("%s", e)
        sys.exit(2)


if __name__ == "__main__":
    main()
