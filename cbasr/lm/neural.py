"""The toolkit's neural token LM as the search and the LM trainer use it: building one from its
config group, loading a ``cbasr-train-lm`` checkpoint, batching sentences, perplexity.

Perplexity is ``exp`` of the mean negative log probability per predicted token, the end of
sentence counted as a token (every sentence predicts ``|y| + 1`` of them).
"""

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from cbasr.config import constructor_options, typed_by_name
from cbasr.config.lm_schema import LSTMLMConfig
from cbasr.lm.shards import length_batches
from cbasr.modules.language_model import LSTMLanguageModel
from cbasr.storage.checkpoint import load_checkpoint

__all__ = [
    "LM_MODELS",
    "build_lm",
    "lm_config",
    "load_lm_checkpoint",
    "perplexity",
    "token_batches",
    "pad_sentences",
]

LM_MODELS = {"lstm": (LSTMLanguageModel, LSTMLMConfig)}  # name: (class, its config schema)


def lm_config(lm: LSTMLMConfig | dict) -> LSTMLMConfig:
    """An ``lm`` config group typed: as it is when typed, else checked against the schema its
    ``name`` selects (a bad entry is a ``ValueError`` naming ``lm.<key>``)."""
    schemas = {name: schema for name, (_, schema) in LM_MODELS.items()}
    return typed_by_name(schemas, lm, "lm", what="language model")


def build_lm(lm: LSTMLMConfig | dict, vocab_size: int) -> LSTMLanguageModel:
    """The LM of an ``lm`` config group (its ``name`` picks the class)."""
    lm = lm_config(lm)
    return LM_MODELS[lm.name][0](vocab_size=vocab_size, **constructor_options(lm))


def token_batches(
    sentences: Sequence[Sequence[int]], max_tokens: int, seed: int | None = None
) -> list[list[int]]:
    """Batches (sentence indices) of similar lengths, each at most ``max_tokens`` padded tokens
    (a longer sentence is a batch of its own); shuffled with ``seed`` (None: in length order)."""
    return length_batches(np.array([len(s) for s in sentences], dtype=np.int64), max_tokens, seed)


def pad_sentences(sentences: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(targets (B, U) padded with 1, lengths (B,))`` of token-id sentences on ``device``."""
    lens = torch.tensor([len(s) for s in sentences], device=device)
    targets = torch.ones(len(sentences), int(lens.max()), dtype=torch.long, device=device)
    for i, s in enumerate(sentences):
        targets[i, : len(s)] = torch.tensor(s, device=device)
    return targets, lens


@torch.no_grad()
def perplexity(
    model: LSTMLanguageModel,
    sentences: Sequence[Sequence[int]],
    max_tokens: int = 4000,
    device: str | torch.device = "cpu",
) -> float:
    """Perplexity of ``model`` on ``sentences`` (module docstring), in eval mode."""
    model.eval()
    total, count = 0.0, 0
    for batch in token_batches(sentences, max_tokens):
        targets, lens = pad_sentences([sentences[i] for i in batch], device)
        total -= float(model.sequence_log_probs(targets, lens).sum())
        count += int(lens.sum()) + len(batch)
    return math.exp(total / max(count, 1))


def load_lm_checkpoint(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[LSTMLanguageModel, list[str]]:
    """``(model in eval mode, vocabulary tokens)`` from a ``cbasr-train-lm`` checkpoint."""
    ckpt = load_checkpoint(path, device)
    if "tokens" not in ckpt or "lm_config" not in ckpt:
        raise ValueError(f"{path} is not a language-model checkpoint of cbasr-train-lm")
    model = build_lm(ckpt["lm_config"], len(ckpt["tokens"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt["tokens"]
