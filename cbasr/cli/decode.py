"""cbasr-decode: decode splits with a trained experiment into ``<exp>/decode/<split>[_<tag>]/``.

    cbasr-decode --exp-dir exp/x --manifest-dir data/synth --feature-dir data/fbank            # greedy
    cbasr-decode ... --beam 8                                     # beam search -> decode/<split>_beam8
    cbasr-decode ... --beam 8 --lm exp/lm --lm-weight 0.3         # shallow fusion (LSTM LM or ARPA file)
    cbasr-decode ... --beam 8 --lm lm.arpa --lm-weight 1 --am-weight 2.5 --ilm-weight 0.9   # HAT eq. (9)
    cbasr-decode ... --beam 8 --cb-search label      # autoregressive CB: label- instead of frame-synchronous
    cbasr-decode ... --splits dev --beam 8 --lm exp/lm --lm-weight 0.2,0.4,0.6 --label-bonus 0,0.5,1
                                                     # a grid: each point decoded and scored, the
                                                     # table in decode/grid_dev_*.md, the best named

The search settings and the data read (the manifest's path and content hash, the feature
directory's ``.done`` stamp) go to ``decode.json``; an existing decoding with the same
checkpoint, settings and data is skipped (``--force`` redoes it), and one of other data (an
edited transcript, features extracted again, another manifest directory) is redone. A missing
``--manifest-dir`` or manifest is an error naming it.
"""

import argparse
import logging
from pathlib import Path

import torch

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.devices import select_device
from cbasr.inference.decode import (
    data_stamp,
    decode_dir_name,
    decode_settings,
    decode_split,
    is_decoded,
)
from cbasr.inference.experiment import Experiment
from cbasr.inference.grid import SWEEPABLE, grid_points, grid_report, run_grid
from cbasr.search import (
    CB_SEARCHES,
    MERGES,
    BeamSearchOptions,
    check_options,
    load_language_model,
    search_family,
)
from cbasr.storage.files import write_text

log = logging.getLogger("cbasr-decode")


LM_SUFFIXES = (".gz", ".arpa", ".pt", ".txt")


def lm_name(path: Path) -> str:
    """An LM's short name in a decode directory: the file or directory name without its file
    type suffixes (``3-gram.pruned.1e-7.arpa.gz`` -> ``3-gram.pruned.1e-7``)."""
    name = path.name
    while name.endswith(LM_SUFFIXES):
        name = name[: name.rindex(".")]
    return name or "lm"


def default_tag(args) -> str | None:
    """What changes the result, in the directory name: the checkpoint unless ``best``, then for
    a beam search ``beam<N>`` (``_lm<weight>-<LM name>`` with an LM, ``_ilm<weight>``, ...);
    None for a greedy decoding of the best checkpoint."""
    name = Path(args.checkpoint).stem if args.checkpoint.endswith(".pt") else args.checkpoint
    checkpoint = [] if name == "best" else [name]
    if args.beam == 0:
        rule = [f"greedy-{args.greedy_rule}"] if args.greedy_rule else []
        return "_".join([*checkpoint, *rule]) or None
    tag = "_".join([*checkpoint, f"beam{args.beam}"])
    if args.lm is not None:
        tag += f"_lm{args.lm_weight:g}-{lm_name(args.lm)}" + ("-words" if args.lm_words else "")
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
        "--lm-words": args.lm_words,
        "--ilm-weight": args.ilm_weight != 0.0,
        "--am-weight": args.am_weight != 1.0,
        "--label-bonus": args.label_bonus != 0.0,
        "--length-norm": args.length_norm,
        "--max-symbols": args.max_symbols is not None,
        "--cb-search": args.cb_search != "auto",
        "--merge": args.merge != "host",
    }
    if args.beam != 0 and args.greedy_rule:
        raise SystemExit("cbasr-decode: --greedy-rule is for the greedy search (--beam 0)")
    if args.beam == 0:
        given = [name for name, set_ in beam_only.items() if set_]
        if given:
            raise SystemExit(
                f"cbasr-decode: {', '.join(given)} need a beam search: add --beam N (N >= 1)"
            )
        return None
    if args.lm is None and args.lm_weight_given:
        raise SystemExit("cbasr-decode: --lm-weight needs --lm")
    if args.lm is None and args.lm_words:
        raise SystemExit("cbasr-decode: --lm-words needs --lm (an ARPA word model)")
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
            merge=args.merge,
        )
    except ValueError as e:
        raise SystemExit(f"cbasr-decode: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option with its help)."""
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
        "--lm-words",
        action="store_true",
        help="--lm is an ARPA word model for a character or piece recogniser: each word is "
        "scored when it ends (docs/decoding.md, shallow fusion)",
    )
    search.add_argument(
        "--lm-weight",
        default=None,
        help="shallow-fusion weight (default 0.5); a comma-separated list is a grid",
    )
    search.add_argument("--am-weight", type=float, default=1.0, help="lambda_1 of HAT eq. (9)")
    search.add_argument(
        "--ilm-weight",
        default=None,
        help="lambda_2 of HAT eq. (9): HAT models only; a list is a grid",
    )
    search.add_argument(
        "--label-bonus",
        default=None,
        help="added to the score per label (default 0); a list is a grid",
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
        "--merge",
        choices=MERGES,
        default="host",
        help="RNN-T and HAT: where the beam search merges its prefixes: host (default), device "
        "(one read of the GPU per batch) or graphs (each frame replayed from a CUDA graph); "
        "the same hypotheses",
    )
    search.add_argument(
        "--greedy-rule",
        choices=("label", "emission"),
        help="transducers' greedy search: emit the best label where it beats the blank (label) "
        "or where P(not blank) > P(blank) (emission); default: the model's loss.greedy; the "
        "directory gets _greedy-<rule>",
    )
    search.add_argument(
        "--tag",
        default=None,
        help="output to decode/<split>_<tag> (default: [<checkpoint>_]beam<N>[_lm<w>-<lm>...]; "
        "greedy: the checkpoint's name unless best)",
    )
    parser.add_argument(
        "--token-map",
        type=Path,
        help="grids: score on mapped tokens (TIMIT: data/timit/map_39.txt), as cbasr-score does",
    )
    return parser


@one_line_errors("cbasr-decode")
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.manifest_dir.is_dir():
        raise SystemExit(f"cbasr-decode: --manifest-dir {args.manifest_dir}: no such directory")
    given = {
        key: _values(parser, SWEEPABLE[key], getattr(args, key))
        for key in ("lm_weight", "label_bonus", "ilm_weight")
    }
    args.lm_weight_given = given["lm_weight"] is not None
    defaults = {"lm_weight": [0.5], "label_bonus": [0.0], "ilm_weight": [0.0]}
    values = {key: given[key] or defaults[key] for key in given}
    grid = grid_points(values)
    for point in grid:  # each point's options checked before loading anything
        search_options(_at(args, point))
    if len(grid) > 1 and args.tag is not None:
        raise SystemExit("cbasr-decode: a grid names each decoding itself: drop --tag")
    setup_logging()
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    exp = Experiment(args.exp_dir, args.checkpoint, select_device(args.device))
    if args.greedy_rule:
        if search_family(exp.model) != "transducer":
            raise SystemExit(f"cbasr-decode: {args.exp_dir}: --greedy-rule is for transducers")
        exp.model.greedy = args.greedy_rule
    lm = (
        load_language_model(args.lm, exp.vocab.tokens, exp.device, args.lm_words, exp.units)
        if args.lm is not None
        else None
    )
    if len(grid) == 1:
        _decode(_at(args, grid[0]), exp, lm, search_options(_at(args, grid[0])))
        return
    swept = [key for key, v in values.items() if len(v) > 1]

    def decode(point: dict) -> dict[str, Path]:
        return _decode(_at(args, point), exp, lm, search_options(_at(args, point)))

    _report(args, run_grid(grid, decode, args.token_map), swept)


def _report(args, results: dict, swept: list[str]) -> None:
    """Each split's grid table: printed, written to ``decode/grid_<split>_<weights>.md``, and
    its best setting logged."""
    title = f"{args.exp_dir}, beam {args.beam}" + (f", LM {args.lm}" if args.lm else "")
    for split, found in results.items():
        text = grid_report(split, found, swept, title)
        name = "grid_" + "_".join([split, *swept]) + ".md"
        write_text(args.exp_dir / "decode" / name, text)
        print(text)
        best = " ".join(f"{SWEEPABLE[k]} {found[0].point[k]:g}" for k in swept)
        log.info("%s: best %s (%.2f%%); table in %s", split, best, found[0].error_rate, name)


def _at(args: argparse.Namespace, point: dict) -> argparse.Namespace:
    """The command line with the weights of a grid point."""
    return argparse.Namespace(**{**vars(args), **point})


def _values(parser, option: str, text: str | None) -> list[float] | None:
    """A comma-separated list of numbers (one number: no grid); None when not given."""
    if text is None:
        return None
    try:
        return [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        parser.error(f"{option} takes a number or a comma-separated list, got {text!r}")


def _decode(args, exp: Experiment, lm, options) -> dict[str, Path]:
    """Decode every split with ``options`` (skipping up-to-date ones); their directories."""
    try:
        settings = decode_settings(exp, options, args.lm, args.lm_words)
        if options is not None:
            check_options(exp.model, options, lm)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"cbasr-decode: {args.exp_dir}: {e}") from None
    tag = args.tag if args.tag is not None else default_tag(args)
    out = {}
    for split in args.splits:
        out_dir = args.exp_dir / "decode" / decode_dir_name(split, tag)
        out[split] = out_dir
        manifest = args.manifest_dir / f"{split}.jsonl"
        try:
            data = data_stamp(manifest, args.feature_dir / split)
        except FileNotFoundError as e:
            raise SystemExit(f"cbasr-decode: {e} (split {split} of --manifest-dir)") from None
        if is_decoded(exp, out_dir, settings, data) and not args.force:
            log.info(
                "%s: already decoded with this checkpoint, these settings and these data, "
                "skipping (--force to redo)",
                out_dir,
            )
            continue
        summary = decode_split(
            exp,
            manifest,
            args.feature_dir / split,
            out_dir,
            options=options,
            lm=lm,
            lm_path=args.lm,
        )
        log.info(
            "%s: decoded %d utterances with the %s checkpoint (epoch %d), %s; %d failed "
            "(no features: empty hypotheses); RTF %.4f",
            out_dir,
            summary["utts"],
            args.checkpoint,
            summary["epoch"],
            "greedy" if options is None else f"beam {options.beam}",
            summary["failed"],
            summary["rtf"] or 0,
        )
    return out


if __name__ == "__main__":
    main()
