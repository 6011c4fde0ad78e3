"""Training an LSTM token LM (``cbasr-train-lm``): an experiment directory in, checkpoints out.

Layout of an LM experiment directory: ``config.json`` (the resolved config), ``vocab.txt``,
``checkpoints/{last,best}.pt`` (atomic), ``history.json`` (per epoch: train and validation
perplexity, :func:`cbasr.lm.neural.perplexity`), ``skipped.tsv`` (sentences with unknown
tokens). Rerunning the same command resumes after the last finished epoch, from the newest
checkpoint that loads (as ``cbasr-train`` does; ``trainer.resume=never`` starts afresh over an
earlier run); a different model config or vocabulary in the same directory is refused.
"""

import logging
import math
from pathlib import Path

import torch

from cbasr.data.vocab import Vocabulary
from cbasr.lm.corpus import read_sentences
from cbasr.lm.neural import build_lm, pad_sentences, perplexity, token_batches
from cbasr.storage.checkpoint import CheckpointDir, rng_state, seed_everything, set_rng_state
from cbasr.storage.files import write_json, write_text

__all__ = ["train_lm"]

log = logging.getLogger(__name__)


def _resume(
    checkpoints: CheckpointDir, exp_dir: Path, cfg: dict, tokens: list[str], model, optimizer
) -> tuple[int, list]:
    """Restore the newest checkpoint that loads (as the acoustic trainer does), naming the
    unreadable ones; refuse a fresh start over an earlier run unless ``trainer.resume=never``."""
    mode = cfg["trainer"].get("resume", "auto")
    path, ckpt, skipped = (None, None, []) if mode == "never" else checkpoints.newest_loadable()
    if path is None:
        earlier = sorted(checkpoints.path.glob("*.pt")) if checkpoints.path.is_dir() else []
        earlier += [p for p in [exp_dir / "history.json"] if p.is_file()]
        if earlier and mode != "never":
            why = f"none of its checkpoints loads ({'; '.join(skipped)})" if skipped else ""
            raise RuntimeError(
                f"{exp_dir} holds an earlier run ({', '.join(p.name for p in earlier)})"
                f"{' but ' + why if why else ' but no checkpoint'}: rerun with "
                "trainer.resume=never to start from scratch over it, or choose another exp_dir"
            )
        for p in earlier:
            log.warning("trainer.resume=never: removing the earlier run's %s", p.name)
            p.unlink()
        return 0, []
    if skipped:
        log.warning(
            "skipped checkpoints that do not load: %s; resuming from %s",
            "; ".join(skipped),
            path.name,
        )
    if ckpt["lm_config"] != cfg["lm"]:
        raise ValueError(
            f"{exp_dir} holds a language model with config {ckpt['lm_config']}, not {cfg['lm']}: "
            "use another exp_dir"
        )
    if ckpt["tokens"] != tokens:
        raise ValueError(
            f"{exp_dir} was trained with another vocabulary than {cfg['data']['vocab']}"
        )
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    set_rng_state(ckpt["rng"])
    log.info("resuming %s after epoch %d", exp_dir, ckpt["epoch"])
    return ckpt["epoch"], ckpt["history"]


def train_lm(cfg: dict, exp_dir: str | Path, device: str | torch.device = "cpu") -> list[dict]:
    """Train (or resume) the LM of ``cfg`` (a resolved ``conf/train_lm.yaml``) in ``exp_dir``.

    Returns:
        The history: per epoch ``{"epoch", "train_ppl", "valid_ppl", "lr"}``.
    """
    exp_dir = Path(exp_dir)
    data, optim, trainer = cfg["data"], cfg["optim"], cfg["trainer"]
    vocab = Vocabulary.load(data["vocab"])
    train_set, skipped = read_sentences(data["train"], vocab, data["units"])
    valid_set, skipped_valid = read_sentences(data["valid"], vocab, data["units"])
    if not train_set:
        raise ValueError(f"{data['train']}: no usable sentence (see {exp_dir / 'skipped.tsv'})")
    if not valid_set:
        raise ValueError(f"{data['valid']}: no usable sentence")
    exp_dir.mkdir(parents=True, exist_ok=True)
    write_text(exp_dir / "skipped.tsv", "".join(line + "\n" for line in skipped + skipped_valid))
    if skipped or skipped_valid:
        log.warning(
            "skipped %d training and %d validation sentences (see %s)",
            len(skipped),
            len(skipped_valid),
            exp_dir / "skipped.tsv",
        )
    seed_everything(trainer["seed"])
    model = build_lm(cfg["lm"], len(vocab)).to(device)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=optim["lr"], weight_decay=optim["weight_decay"]
    )
    checkpoints = CheckpointDir(exp_dir / "checkpoints", keep=0)
    checkpoints.path.mkdir(parents=True, exist_ok=True)
    checkpoints.remove_temporaries()
    start, history = _resume(checkpoints, exp_dir, cfg, vocab.tokens, model, optimizer)
    write_json(exp_dir / "config.json", cfg)
    vocab.save(exp_dir / "vocab.txt")
    log.info(
        "LM: %.2fM parameters; %d training and %d validation sentences",
        sum(p.numel() for p in model.parameters()) / 1e6,
        len(train_set),
        len(valid_set),
    )
    for epoch in range(start + 1, trainer["max_epochs"] + 1):
        model.train()
        total, count = 0.0, 0
        for batch in token_batches(
            train_set, data["max_tokens"], seed=trainer["seed"] * 1000 + epoch
        ):
            targets, lens = pad_sentences([train_set[i] for i in batch], device)
            log_prob = model.sequence_log_probs(targets, lens)  # (B,)
            predicted = int(lens.sum()) + len(batch)
            loss = -log_prob.sum() / predicted
            optimizer.zero_grad()
            loss.backward()
            if optim["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), optim["grad_clip"])
            optimizer.step()
            total, count = total - float(log_prob.detach().sum()), count + predicted
        valid_ppl = perplexity(model, valid_set, data["max_tokens"], device)
        history.append(
            {
                "epoch": epoch,
                "train_ppl": math.exp(total / count),
                "valid_ppl": valid_ppl,
                "lr": optim["lr"],
            }
        )
        log.info(
            "epoch %d: train perplexity %.3f, valid perplexity %.3f",
            epoch,
            history[-1]["train_ppl"],
            valid_ppl,
        )
        state = {
            "lm_config": cfg["lm"],
            "config": cfg,
            "tokens": vocab.tokens,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch,
            "history": history,
            "rng": rng_state(),
        }
        checkpoints.save("last", state)
        if valid_ppl <= min(h["valid_ppl"] for h in history):
            checkpoints.copy("last", "best")  # an independent file, written atomically
        write_json(exp_dir / "history.json", history)
    return history
