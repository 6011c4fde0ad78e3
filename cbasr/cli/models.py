"""cbasr-models: the decoder x loss compatibility table and parameter counts, without training.

    cbasr-models table                                  # Markdown table of every preset pair
    cbasr-models params encoder=conformer decoder=hat loss=hat [--input-dim 80 --vocab-size 50]

Both read the presets in ``conf/`` through Hydra, so they answer for exactly what
``cbasr-train`` would build from the same overrides.
"""

import argparse

from hydra import compose, initialize_config_dir

from cbasr import builder
from cbasr.cli.common import one_line_errors
from cbasr.config import CONF_DIR, to_plain
from cbasr.config.schema import register_configs


def compose_model_config(overrides: list[str]) -> dict:
    """The ``encoder``, ``decoder`` and ``loss`` groups of ``conf/train.yaml`` with ``overrides``,
    typed (:func:`cbasr.builder.model_configs`)."""
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["exp_dir=unused", *overrides])
    groups = ("encoder", "decoder", "loss")
    return dict(zip(groups, builder.model_configs({k: to_plain(cfg[k]) for k in groups})))


def presets(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def count_parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())


def compatibility_table(input_dim: int = 80, vocab_size: int = 50, encoder: str = "blstm") -> str:
    """Markdown: one row per decoder preset, a column per loss preset, and the decoder's size."""
    losses = presets("loss")
    lines = [
        f"| decoder preset | {' | '.join(losses)} | decoder parameters |",
        "|---|" + ":---:|" * len(losses) + "---:|",
    ]
    loss_configs = [compose_model_config([f"loss={loss}"])["loss"] for loss in losses]
    for name in presets("decoder"):
        cfg = compose_model_config([f"encoder={encoder}", f"decoder={name}"])
        enc = builder.build_model(
            cfg["encoder"], {"name": "pointwise"}, {"name": "ctc"}, input_dim, vocab_size
        ).encoder
        dec = builder.build_decoder(cfg["decoder"], enc.output_dim, vocab_size)
        marks = ["" if builder.refusal(loss, dec) else "yes" for loss in loss_configs]
        lines.append(f"| {name} | {' | '.join(marks)} | {count_parameters(dec):,} |")
    return "\n".join(lines) + "\n"


@one_line_errors("cbasr-models")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["table", "params"])
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. encoder=conformer decoder=hat loss=hat"
    )
    parser.add_argument(
        "--input-dim", type=int, default=80, help="feature dimension (source vocabulary for text)"
    )
    parser.add_argument("--vocab-size", type=int, default=50, help="target ids, blank included")
    args = parser.parse_args(argv)
    if args.command == "table":
        print(compatibility_table(args.input_dim, args.vocab_size), end="")
        return
    cfg = compose_model_config(args.overrides)
    model = builder.build_model(*cfg.values(), args.input_dim, args.vocab_size)
    total, enc = count_parameters(model), count_parameters(model.encoder)
    print(
        f"encoder {cfg['encoder'].name}: {enc:,}\ndecoder {cfg['decoder'].name}: {total - enc:,}\n"
        f"total ({type(model).__name__}, loss {cfg['loss'].name}): {total:,}"
    )


if __name__ == "__main__":
    main()
