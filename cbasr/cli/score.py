"""cbasr-score: error rates (S/D/I) of decoded splits into ``<exp>/decode/<split>/score.json``."""

import argparse
import json
import logging
from pathlib import Path

from cbasr.cli.common import setup_logging
from cbasr.engines.scoring import error_counts, read_trn
from cbasr.fileio import write_json

log = logging.getLogger("cbasr-score")


def score_dir(decode_dir: Path) -> dict:
    """Score ``hyp.trn`` against ``ref.trn`` in ``decode_dir``; every reference needs a hypothesis."""
    refs, hyps = read_trn(decode_dir / "ref.trn"), read_trn(decode_dir / "hyp.trn")
    missing = sorted(set(refs) - set(hyps))
    if missing:
        raise ValueError(f"{decode_dir}/hyp.trn lacks {len(missing)} utterances, e.g. {missing[:3]}")
    ids = sorted(refs)
    score = error_counts([refs[i] for i in ids], [hyps[i] for i in ids])
    decode_info = decode_dir / "decode.json"
    if decode_info.is_file():
        info = json.loads(decode_info.read_text())
        score.update(skipped=info["skipped"], checkpoint=info["checkpoint"], epoch=info["epoch"])
    write_json(decode_dir / "score.json", score)
    return score


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exp-dir", required=True, type=Path)
    parser.add_argument("--splits", nargs="+", default=["dev", "test"])
    args = parser.parse_args(argv)
    setup_logging()
    for split in args.splits:
        s = score_dir(args.exp_dir / "decode" / split)
        log.info("%s: error rate %.2f%% (%d sub, %d del, %d ins / %d tokens, %d utts, %d skipped)", split,
                 s["error_rate"], s["sub"], s["del"], s["ins"], s["ref_tokens"], s["utts"], s.get("skipped", 0))


if __name__ == "__main__":
    main()
