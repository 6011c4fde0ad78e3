"""Fine-tuning: a new run that starts from another model's weights (``trainer.init_from``).

Only the model's parameters and buffers are taken; the optimizer, the schedule, the step count
and the history start afresh. Every parameter must match by name and shape unless a glob of
``trainer.init_skip`` names it (those keep their new initialisation: e.g. ``decoder.output.*``
for a new output layer over a new vocabulary). When the source is an experiment (or a
checkpoint inside one) its ``vocab.txt`` is compared with this run's: a different token
inventory is refused unless parameters are skipped, since the output rows would stand for
other tokens.
"""

import fnmatch
import logging
from pathlib import Path

import torch

from cbasr.data.vocab import Vocabulary
from cbasr.storage.checkpoint import checkpoint_of, load_checkpoint

__all__ = ["init_source", "load_initial_weights"]

log = logging.getLogger(__name__)


def init_source(path: str | Path) -> tuple[Path, Path | None]:
    """``(checkpoint file, experiment directory or None)`` of a ``trainer.init_from`` value."""
    path = Path(path)
    hint = f"={path}: an experiment directory holds checkpoints/best.pt"
    checkpoint = checkpoint_of(path, "trainer.init_from", hint)
    if path.is_dir():
        return checkpoint, path
    return checkpoint, (path.parent.parent if path.parent.name == "checkpoints" else None)


def _skipped(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def load_initial_weights(
    model: torch.nn.Module, source: str | Path, skip: list[str], vocab: Vocabulary
) -> list[str]:
    """Copy ``source``'s model weights into ``model``; returns the names left as initialised.

    Raises:
        ValueError: a parameter missing on either side, a shape mismatch or a different
            vocabulary, naming the parameter (or token) and the option that resolves it.
    """
    checkpoint, exp = init_source(source)
    weights = load_checkpoint(checkpoint, "cpu")["model"]
    if exp is not None and (exp / "vocab.txt").is_file() and not skip:
        theirs = Vocabulary.load(exp / "vocab.txt").tokens
        if theirs != vocab.tokens:
            first = next(
                (i for i, (a, b) in enumerate(zip(theirs, vocab.tokens)) if a != b),
                min(len(theirs), len(vocab.tokens)),
            )
            shaped = [n for n, w in weights.items() if len(theirs) in w.shape]
            raise ValueError(
                f"trainer.init_from={source}: its vocabulary ({len(theirs)} tokens) differs from "
                f"data.vocab's ({len(vocab.tokens)}) from id {first} on "
                f"({theirs[first] if first < len(theirs) else 'end'!r} vs "
                f"{vocab.tokens[first] if first < len(vocab.tokens) else 'end'!r}): leave the "
                f"output layer new with trainer.init_skip (its parameters: {shaped})"
            )
    own = model.state_dict()
    missing = [n for n in own if n not in weights and not _skipped(n, skip)]
    extra = [n for n in weights if n not in own and not _skipped(n, skip)]
    if missing or extra:
        raise ValueError(
            f"trainer.init_from={source}: parameters differ by name (this model only: "
            f"{missing[:5]}; the source only: {extra[:5]}); name those to leave new in "
            "trainer.init_skip"
        )
    for name, value in own.items():
        if name in weights and not _skipped(name, skip) and weights[name].shape != value.shape:
            raise ValueError(
                f"trainer.init_from={source}: parameter {name} has shape "
                f"{tuple(weights[name].shape)} there and {tuple(value.shape)} here; check the "
                f"model config, or leave it new with trainer.init_skip=[{name}]"
            )
    kept = {n: w for n, w in weights.items() if n in own and not _skipped(n, skip)}
    model.load_state_dict(kept, strict=False)
    new = sorted(n for n in own if n not in kept)
    log.info(
        "initialised from %s: %d of %d tensors%s",
        checkpoint,
        len(kept),
        len(own),
        f"; left new: {new}" if new else "",
    )
    return new
