"""cbasr-score: error rates (S/D/I) of decoded splits into ``<exp>/decode/<split>[_<tag>]/``.

Writes ``score.json`` (totals, bootstrap 95% interval, per speaker), ``per_utt.tsv`` and
``errors.pra`` (every utterance's alignment with its errors marked) next to the trn files.
``score.json`` also counts the deletions of reference tokens that repeat their predecessor
(``repeat_deletions`` of ``repeat_tokens``) apart from the others (``other_deletions`` of
``other_tokens``): a model that merges equal neighbouring labels shows there; where the
decoding wrote ``timing.tsv``, the median and 90th percentile delay of each correct token's
emission after its gold end (``emission_delay``; :mod:`cbasr.evaluation.delay`).
"""

import argparse
import logging
from pathlib import Path

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.data.manifest import read_manifest
from cbasr.evaluation.scoring import decode_dir_name, score_decode_dir

log = logging.getLogger("cbasr-score")


@one_line_errors("cbasr-score")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exp-dir", required=True, type=Path)
    parser.add_argument("--splits", nargs="+", default=["dev", "test"])
    parser.add_argument(
        "--tag", default=None, help="score decode/<split>_<tag> (as cbasr-decode --tag wrote it)"
    )
    parser.add_argument(
        "--bootstrap", type=int, default=1000, help="bootstrap replicates for the 95%% interval"
    )
    parser.add_argument(
        "--speakers", action="store_true", help="also log each speaker's error rate"
    )
    parser.add_argument(
        "--token-map",
        type=Path,
        help="map tokens before scoring: 'token<TAB>mapped' lines, empty mapped deletes "
        "(TIMIT: data/timit/map_39.txt scores 61 or 48 phones on 39)",
    )
    parser.add_argument(
        "--rouge", action="store_true", help="also ROUGE-1/2/L F1 of the words (headlines)"
    )
    parser.add_argument(
        "--group-by",
        nargs="+",
        default=[],
        metavar="FIELD",
        help="also score the utterances of each value of these manifest fields (age_group)",
    )
    parser.add_argument("--manifest-dir", type=Path, help="where <split>.jsonl is, for --group-by")
    args = parser.parse_args(argv)
    if args.group_by and args.manifest_dir is None:
        parser.error("--group-by needs --manifest-dir")
    setup_logging()
    for split in args.splits:
        name = decode_dir_name(split, args.tag)
        groups = None
        if args.group_by:
            records = read_manifest(args.manifest_dir / f"{split}.jsonl")
            groups = {f: {r["id"]: r.get(f, "unknown") for r in records} for f in args.group_by}
        s = score_decode_dir(
            args.exp_dir / "decode" / name,
            args.bootstrap,
            token_map=args.token_map,
            rouge=args.rouge,
            groups=groups,
        )
        log.info(
            "%s: error rate %.2f%% [%.2f, %.2f] (%d sub, %d del, %d ins / %d tokens, %d utts, %d failed)",
            name,
            s["error_rate"],
            *s["ci95"],
            s["sub"],
            s["del"],
            s["ins"],
            s["ref_tokens"],
            s["utts"],
            s.get("failed", 0) + s.get("skipped", 0),
        )
        log.info(
            "%s: deleted %d of %d repeated tokens (%.2f%%), %d of %d others (%.2f%%)",
            name,
            s["repeat_deletions"],
            s["repeat_tokens"],
            100.0 * s["repeat_deletions"] / max(s["repeat_tokens"], 1),
            s["other_deletions"],
            s["other_tokens"],
            100.0 * s["other_deletions"] / max(s["other_tokens"], 1),
        )
        if s.get("emission_delay", {}).get("units"):
            d = s["emission_delay"]
            log.info(
                "%s: emission delay after the gold end: median %.0f ms, 90th percentile %.0f ms "
                "(%d correct tokens, emitted %s)",
                name,
                d["p50_ms"],
                d["p90_ms"],
                d["units"],
                d["emission"] or "?",
            )
        if s.get("empty_refs") or s.get("oov_ref_utts"):
            log.warning(
                "%s: %d utterances with an empty reference and %d with reference tokens outside "
                "the model's vocabulary are in this score (see decode.json)",
                name,
                s.get("empty_refs", 0),
                s.get("oov_ref_utts", 0),
            )
        if "rouge" in s:
            log.info(
                "%s: ROUGE-1 %.2f ROUGE-2 %.2f ROUGE-L %.2f (F1, %d pairs)",
                name,
                s["rouge"]["rouge1"],
                s["rouge"]["rouge2"],
                s["rouge"]["rougeL"],
                s["rouge"]["pairs"],
            )
        for field in args.group_by:
            for value, c in s[f"by_{field}"].items():
                log.info(
                    "%s: %s %s: %.2f%% [%.2f, %.2f] (%d tokens, %d utts)",
                    name,
                    field,
                    value,
                    c["error_rate"],
                    *c["ci95"],
                    c["ref_tokens"],
                    c["utts"],
                )
        if args.speakers:
            for speaker, c in s.get("by_speaker", {}).items():
                log.info(
                    "  %s: %.2f%% (%d sub, %d del, %d ins / %d tokens, %d utts)",
                    speaker,
                    c["error_rate"],
                    c["sub"],
                    c["del"],
                    c["ins"],
                    c["ref_tokens"],
                    c["utts"],
                )


if __name__ == "__main__":
    main()
