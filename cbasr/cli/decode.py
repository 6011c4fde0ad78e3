"""cbasr-decode: decode splits with a trained experiment into ``<exp>/decode/<split>[_<tag>]/``.

    cbasr-decode --exp-dir exp/x --manifest-dir data/synth --feature-dir data/fbank            # greedy
    cbasr-decode ... --beam 8                                     # beam search -> decode/<split>_beam8
    cbasr-decode ... --beam 8 --lm exp/lm --lm-weight 0.3         # shallow fusion (LSTM LM or ARPA file)
    cbasr-decode ... --beam 8 --lm lm.arpa --lm-weight 1 --am-weight 2.5 --ilm-weight 0.9   # HAT eq. (9)
    cbasr-decode ... --beam 8 --cb-search label      # autoregressive CB: label- instead of frame-synchronous

The search settings go to ``decode.json``; an existing decoding with the same checkpoint and
settings is skipped (``--force`` redoes it).
"""

import argparse
import logging
from pathlib import Path

import torch

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.engines.decode import (
    Experiment,
    decode_dir_name,
    decode_settings,
    decode_split,
    is_decoded,
)
from cbasr.engines.training_options import select_device
from cbasr.search import CB_SEARCHES, BeamSearchOptions, check_options, load_language_model

log = logging.getLogger("cbasr-decode")


def lm_name(path: Path) -> str:
    """An LM's short name in a decode directory: the file or directory name without suffixes."""
    return path.name.split(".")[0] or "lm"


def default_tag(args) -> str | None:
    """What changes the result, in the directory name: the checkpoint unless ``best``, then for
    a beam search ``beam<N>`` (``_lm<weight>-<LM name>`` with an LM, ``_ilm<weight>``, ...);
    None for a greedy decoding of the best checkpoint."""
    name = Path(args.checkpoint).stem if args.checkpoint.endswith(".pt") else args.checkpoint
    checkpoint = [] if name == "best" else [name]
    if args.beam == 0:
        return "_".join(checkpoint) or None
    tag = "_".join([*checkpoint, f"beam{args.beam}"])
    if args.lm is not None:
        tag += f"_lm{args.lm_weight:g}-{lm_name(args.lm)}"
    if args.am_weight != 1.0:
        tag += f"_am{args.am_weight:g}"
    if args.ilm_weight:
        tag += f"_ilm{args.ilm_weight:g}"
    if args.label_bonus:
        tag += f"_bonus{args.label_bonus:g}"
    if args.length_norm:
        tag += "_norm"
    if args.cb_search != "auto":
        tag += f"_{args.cb_search}"
    return tag


def search_options(args) -> BeamSearchOptions | None:
    """The beam search of the command line, or None for greedy; errors name the option."""
    if args.beam < 0:
        raise SystemExit(
            f"cbasr-decode: --beam must be 0 (greedy) or a beam width >= 1, got {args.beam}"
        )
    beam_only = {
        "--lm": args.lm is not None,
        "--ilm-weight": args.ilm_weight != 0.0,
        "--am-weight": args.am_weight != 1.0,
        "--label-bonus": args.label_bonus != 0.0,
        "--length-norm": args.length_norm,
        "--max-symbols": args.max_symbols is not None,
        "--cb-search": args.cb_search != "auto",
    }
    if args.beam == 0:
        given = [name for name, set_ in beam_only.items() if set_]
        if given:
            raise SystemExit(
                f"cbasr-decode: {', '.join(given)} need a beam search: add --beam N (N >= 1)"
            )
        return None
    if args.lm is None and args.lm_weight_given:
        raise SystemExit("cbasr-decode: --lm-weight needs --lm")
    try:
        return BeamSearchOptions(
            beam=args.beam,
            am_weight=args.am_weight,
            lm_weight=args.lm_weight if args.lm is not None else 0.0,
            ilm_weight=args.ilm_weight,
            label_bonus=args.label_bonus,
            length_norm=args.length_norm,
            max_symbols=args.max_symbols,
            cb_search=args.cb_search,
        )
    except ValueError as e:
        raise SystemExit(f"cbasr-decode: {e}") from None


@one_line_errors("cbasr-decode")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exp-dir", required=True, type=Path)
    parser.add_argument("--manifest-dir", required=True, type=Path, help="holds <split>.jsonl")
    parser.add_argument("--feature-dir", required=True, type=Path, help="holds <split>/ features")
    parser.add_argument("--splits", nargs="+", default=["dev", "test"])
    parser.add_argument(
        "--checkpoint",
        default="best",
        help="best | last | averaged | a name in checkpoints/ | a .pt file",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--num-threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: searches are many small operations, which two "
        "threads slow down on a busy CPU; 0: torch's default)",
    )
    parser.add_argument(
        "--force", action="store_true", help="decode even if outputs are up to date"
    )
    search = parser.add_argument_group("search")
    search.add_argument(
        "--beam", type=int, default=0, help="beam width; 0 (default): the model's greedy search"
    )
    search.add_argument(
        "--lm",
        type=Path,
        default=None,
        help="external LM: a cbasr-train-lm directory or .pt checkpoint, or an ARPA file",
    )
    search.add_argument(
        "--lm-weight", type=float, default=None, help="shallow-fusion weight (default 0.5)"
    )
    search.add_argument("--am-weight", type=float, default=1.0, help="lambda_1 of HAT eq. (9)")
    search.add_argument(
        "--ilm-weight", type=float, default=0.0, help="lambda_2 of HAT eq. (9): HAT models only"
    )
    search.add_argument(
        "--label-bonus", type=float, default=0.0, help="added to the score per label"
    )
    search.add_argument(
        "--length-norm", action="store_true", help="rank final hypotheses by score per label"
    )
    search.add_argument(
        "--max-symbols",
        type=int,
        default=None,
        help="transducers: most labels per frame (default: the model's)",
    )
    search.add_argument(
        "--cb-search",
        choices=CB_SEARCHES,
        default="auto",
        help="CB models: frame-synchronous prefix search or label-synchronous search (autoregressive "
        "decoders only; default auto: frame)",
    )
    search.add_argument(
        "--tag",
        default=None,
        help="output to decode/<split>_<tag> (default: [<checkpoint>_]beam<N>[_lm<w>-<lm>...]; "
        "greedy: the checkpoint's name unless best)",
    )
    args = parser.parse_args(argv)
    args.lm_weight_given = args.lm_weight is not None
    if args.lm_weight is None:
        args.lm_weight = 0.5
    options = search_options(args)
    setup_logging()
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    exp = Experiment(args.exp_dir, args.checkpoint, select_device(args.device))
    lm = load_language_model(args.lm, exp.vocab.tokens, exp.device) if args.lm is not None else None
    try:
        settings = decode_settings(exp, options, args.lm)
        if options is not None:
            check_options(exp.model, options, lm)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"cbasr-decode: {args.exp_dir}: {e}") from None
    tag = args.tag if args.tag is not None else default_tag(args)
    for split in args.splits:
        out_dir = args.exp_dir / "decode" / decode_dir_name(split, tag)
        if is_decoded(exp, out_dir, settings) and not args.force:
            log.info(
                "%s: already decoded with this checkpoint and these settings, skipping (--force to redo)",
                out_dir,
            )
            continue
        summary = decode_split(
            exp,
            args.manifest_dir / f"{split}.jsonl",
            args.feature_dir / split,
            out_dir,
            options=options,
            lm=lm,
            lm_path=args.lm,
        )
        log.info(
            "%s: decoded %d utterances with the %s checkpoint (epoch %d), %s; %d skipped; RTF %.4f",
            out_dir,
            summary["utts"],
            args.checkpoint,
            summary["epoch"],
            "greedy" if options is None else f"beam {options.beam}",
            summary["skipped"],
            summary["rtf"] or 0,
        )


if __name__ == "__main__":
    main()
