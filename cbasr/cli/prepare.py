"""cbasr-prepare: manifests for a licensed corpus from the user's copy of it.

    cbasr-prepare timit --corpus-dir /data/TIMIT --out data/timit [--phone-set 48|61]
    cbasr-prepare wsj --corpus-dir /data/wsj --out data/wsj
    cbasr-prepare wsj-lm --corpus-dir /data/wsj --out data/wsj_lm   # LM text and base ARPA LMs
    cbasr-prepare gigaword --corpus-dir /data/gigaword --out data/gigaword
    cbasr-prepare librispeech --corpus-dir downloads --out data/librispeech [--subsets ...]
    cbasr-prepare speechocean762 --corpus-dir downloads/speechocean762 --out data/so762
    cbasr-prepare kaldi --data-dir data/train data/dev --out data/mine [--run-pipes] \
        [--audio-root DIR]
    cbasr-prepare lhotse --manifests train=cuts_train.jsonl.gz dev=recordings_dev.jsonl.gz \
        dev=supervisions_dev.jsonl.gz --out data/mine

``--min-duration`` / ``--max-duration`` (seconds) leave out utterances outside the range, counted
in ``skipped.tsv`` with the reason.

Relative audio paths in Kaldi's ``wav.scp`` and lhotse's sources are relative to the working
directory, as Kaldi and lhotse read them, or to ``--audio-root``.

A rerun on a complete output directory with the same options does nothing; an interrupted one
is redone. A directory that is not the corpus fails with what was expected and what was found
(exit 2); a split of which no utterance is usable fails with one line naming the split, the
count skipped and the most common reason, with an example (exit 1).
"""

import argparse
import logging
import math
import sys
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.corpora.prepare import CorpusError, DurationFilter, EmptySplitError

log = logging.getLogger("cbasr-prepare")


@one_line_errors("cbasr-prepare")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="corpus", required=True)
    corpora = ("timit", "wsj", "wsj-lm", "gigaword", "librispeech", "speechocean762", "kaldi")
    for name in (*corpora, "lhotse"):
        p = sub.add_parser(name)
        if name == "lhotse":
            p.add_argument(
                "--manifests",
                required=True,
                nargs="+",
                metavar="SPLIT=FILE",
                help="lhotse .jsonl(.gz) manifests by split: cuts, or recordings and supervisions",
            )
        if name in ("kaldi", "lhotse"):
            p.add_argument(
                "--run-pipes",
                action="store_true",
                help="run audio commands ('... |') once each and store their audio in OUT/audio",
            )
            p.add_argument(
                "--audio-root",
                type=Path,
                help="what relative audio paths are relative to (default: the working directory)",
            )
        if name == "kaldi":
            p.add_argument(
                "--data-dir", required=True, type=Path, nargs="+", help="Kaldi data directories"
            )
            p.add_argument(
                "--splits", nargs="+", help="their split names (default: the directory names)"
            )
        elif name != "lhotse":
            p.add_argument("--corpus-dir", required=True, type=Path)
            p.add_argument(
                "--allow-partial",
                action="store_true",
                help="accept a subset of the corpus (split sizes other than the standard ones)",
            )
        p.add_argument("--out", "--out-dir", dest="out", required=True, type=Path)
        if name not in ("wsj-lm", "gigaword"):  # text corpora have no durations
            p.add_argument("--min-duration", type=float, default=0.0, help="seconds")
            p.add_argument("--max-duration", type=float, default=math.inf, help="seconds")
        if name == "librispeech":
            p.add_argument(
                "--subsets",
                nargs="+",
                metavar="SUBSET",
                help="subsets to prepare (default: every one found under --corpus-dir)",
            )
        if name == "speechocean762":
            p.add_argument(
                "--dev-speakers",
                type=int,
                default=12,
                help="train speakers held out as dev, spread over the ages",
            )
        if name == "timit":
            p.add_argument(
                "--phone-set", choices=["61", "48"], default="48", help="training labels"
            )
    args = parser.parse_args(argv)
    setup_logging()
    durations = DurationFilter(
        getattr(args, "min_duration", 0.0), getattr(args, "max_duration", math.inf)
    )
    try:
        if args.corpus == "timit":
            from cbasr.corpora.timit import prepare_timit

            prepare_timit(
                args.corpus_dir,
                args.out,
                args.phone_set,
                strict=not args.allow_partial,
                durations=durations,
            )
        elif args.corpus == "wsj":
            from cbasr.corpora.wsj import prepare_wsj

            prepare_wsj(args.corpus_dir, args.out, not args.allow_partial, durations)
        elif args.corpus == "wsj-lm":
            from cbasr.corpora.wsj_lm import prepare_wsj_lm

            prepare_wsj_lm(args.corpus_dir, args.out, not args.allow_partial)
        elif args.corpus == "librispeech":
            from cbasr.corpora.librispeech import prepare_librispeech

            prepare_librispeech(
                args.corpus_dir, args.out, args.subsets, not args.allow_partial, durations
            )
        elif args.corpus == "speechocean762":
            from cbasr.corpora.speechocean762 import prepare_speechocean762

            prepare_speechocean762(
                args.corpus_dir,
                args.out,
                args.dev_speakers,
                durations,
                strict=not args.allow_partial,
            )
        elif args.corpus == "lhotse":
            from cbasr.corpora.lhotse import prepare_lhotse

            manifests: dict[str, list[str]] = {}
            for item in args.manifests:
                split, sep, path = item.partition("=")
                if not sep or not split or not path:
                    raise SystemExit(f"cbasr-prepare: --manifests takes SPLIT=FILE, got {item!r}")
                manifests.setdefault(split, []).append(path)
            prepare_lhotse(manifests, args.out, args.run_pipes, durations, args.audio_root)
        elif args.corpus == "kaldi":
            from cbasr.corpora.kaldi import prepare_kaldi

            prepare_kaldi(
                args.data_dir, args.out, args.splits, args.run_pipes, durations, args.audio_root
            )
        else:
            from cbasr.corpora.gigaword import prepare_gigaword

            prepare_gigaword(args.corpus_dir, args.out, strict=not args.allow_partial)
    except EmptySplitError as e:
        log.error("%s", e)
        sys.exit(1)
    except CorpusError as e:
        log.error("%s", e)
        sys.exit(2)


if __name__ == "__main__":
    main()
