"""Acoustic model training (``cbasr-train``) as a task of the shared loop: utterances of a
prepared corpus batched by frames, the model of the ``encoder``/``decoder``/``loss`` groups,
validation loss and greedy error rate.

Batches are a deterministic function of ``(seed, epoch)`` and augmentation of
``(seed, epoch, utterance)``, so a resumed epoch continues exactly where the killed one stopped.
"""

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from cbasr.builder import build_model, model_configs
from cbasr.config import plain, typed
from cbasr.config.schema import DataConfig, TrainConfig, TrainerConfig
from cbasr.config.upgrade import drop_removed_keys, today_s_keys
from cbasr.data.batching import BucketBatchSampler, shard
from cbasr.data.dataset import AsrDataset, Batch, collate
from cbasr.data.features import FEATURE_SETTINGS, load_cmvn, write_feature_settings
from cbasr.data.source_tokens import SOURCE_VOCAB, experiment_input
from cbasr.data.vocab import Vocabulary
from cbasr.evaluation.delay import gold_ends
from cbasr.evaluation.scoring import error_counts
from cbasr.models.base import subsampling_stride
from cbasr.search import BeamSearchOptions, beam_search
from cbasr.storage.files import write_json
from cbasr.training import distributed
from cbasr.training.fine_tuning import load_initial_weights
from cbasr.training.gap_check import check_long_gaps
from cbasr.training.options import augmentation_of, fbank_options_of
from cbasr.training.task import TaskOutput
from cbasr.training.trainer import Trainer, run

__all__ = ["AsrTask", "asr_trainer", "train", "MODEL_KEYS", "BATCH_KEYS"]

log = logging.getLogger("cbasr.training.trainer")

# Config entries that define the model: a resumed run must not change them.
MODEL_KEYS = ("encoder", "decoder", "loss", "data.units")
# Config entries that define the batches: changing them moves the position within the epoch.
BATCH_KEYS = ("data.max_frames", "data.max_utts", "data.train_split", "trainer.seed")


def _settings(cfg: dict) -> dict:
    """The typed values of :data:`MODEL_KEYS` and :data:`BATCH_KEYS` in a plain config, so that
    an older config (a checkpoint's) compares equal where it only lacks today's defaults."""
    encoder, decoder, loss = model_configs(cfg)
    data = typed(DataConfig, cfg["data"], "data")
    return {
        "encoder": encoder,
        "decoder": decoder,
        "loss": loss,
        "data.units": data.units,
        "data.max_frames": data.max_frames,
        "data.max_utts": data.max_utts,
        "data.train_split": data.train_split,
        "trainer.seed": typed(TrainerConfig, cfg["trainer"], "trainer").seed,
    }


class AsrTask:
    """Speech recognition training on the corpus of ``cfg.data``.

    Args:
        cfg: the ``cbasr-train`` config, typed.
        exp_dir: the experiment directory (it holds the vocabulary and input description the
            model is built from).
    """

    metrics = ("valid_error_rate", "valid_loss")
    unit = "frames"

    def __init__(self, cfg: TrainConfig, exp_dir: str | Path):
        self.cfg, self.exp_dir = cfg, Path(exp_dir)
        self.data: DataConfig = cfg.data
        self.options: TrainerConfig = cfg.trainer
        self.model_config = model_configs(cfg)
        self.model: torch.nn.Module | None = None
        self.device = torch.device("cpu")

    def prepare(self, exp_dir: Path) -> None:
        """Copy the vocabulary and the input description (CMVN statistics, or the source
        vocabulary of a text corpus) in, so the directory stands alone; write the config."""
        data = self.data
        features = Path(data.feature_dir)
        described = SOURCE_VOCAB if (features / SOURCE_VOCAB).is_file() else "cmvn.json"
        for src, dst in ((data.vocab, "vocab.txt"), (features / described, described)):
            if not (exp_dir / dst).exists():
                if not Path(src).is_file():
                    raise FileNotFoundError(
                        f"{src} not found (data.{'vocab' if dst == 'vocab.txt' else 'feature_dir'})"
                    )
                shutil.copyfile(src, exp_dir / dst)
        if described == "cmvn.json" and not (exp_dir / FEATURE_SETTINGS).is_file():
            split_dir = features / data.train_split
            dim = load_cmvn(exp_dir / "cmvn.json")[0].numel()
            write_feature_settings(
                exp_dir, fbank_options_of(split_dir, dim), data.features == "cached"
            )
        write_json(exp_dir / "config.json", plain(self.cfg))

    def build_model(self, device: torch.device) -> torch.nn.Module:
        self.device = device
        self.vocab = Vocabulary.load(self.exp_dir / "vocab.txt")
        self.input_dim, self.cmvn = experiment_input(self.exp_dir)  # fbank, or source tokens
        self.model = build_model(
            *self.model_config,
            input_dim=self.input_dim,
            vocab_size=len(self.vocab),
        ).to(device)
        return self.model

    def build_data(self, dist: distributed.DistContext) -> None:
        data, seed = self.data, self.options.seed
        self.dist = dist
        fbank = None
        if data.features == "on_the_fly":
            fbank = fbank_options_of(Path(data.feature_dir) / data.train_split, self.input_dim)
        label_times = None
        if self.model.needs_label_ends:  # the labels' gold end times, and seconds per frame
            split_dir = Path(data.feature_dir) / data.train_split
            options = fbank or fbank_options_of(split_dir, self.input_dim)
            self.frame_period = subsampling_stride(self.model) * options.frame_shift_ms / 1000.0

            def label_times(record: dict, tokens: int) -> list[float | None] | None:
                return gold_ends(record, data.units, tokens)

        self.train_set, self.valid_set = (
            AsrDataset(
                Path(data.manifest_dir) / f"{split}.jsonl",
                Path(data.feature_dir) / split,
                self.vocab,
                data.units,
                self.cmvn,
                check=self.model.check_utterance,
                fbank=fbank,
                augmentation=augmentation,
                seed=seed,
                label_times=times,
                utterance_mean=data.mean_norm == "utterance",
            )
            for split, augmentation, times in (
                (data.train_split, augmentation_of(data), label_times),
                (data.valid_split, None, None),
            )
        )
        if len(self.train_set) == 0:
            raise RuntimeError(
                f"no usable training utterances in {data.manifest_dir} (data.manifest_dir)"
            )
        check_long_gaps(self.model, self.train_set.num_frames, self.train_set.target_lens)
        if len(self.valid_set) == 0:
            log.warning(
                "no usable %s utterances (data.valid_split): validation metrics are meaningless and "
                "best.pt, reduce-on-plateau and early stopping follow them",
                data.valid_split,
            )
        self.sampler = BucketBatchSampler(
            self.train_set.num_frames,
            data.max_frames,
            data.max_utts,
            shuffle=True,
            seed=seed,
            min_utts=dist.world_size,
        )

    @property
    def steps_per_epoch(self) -> int:
        return len(self.sampler)

    def describe(self) -> str:
        return f"{len(self.train_set)} training utterances"

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        self.sampler.set_epoch(epoch)
        self.train_set.set_epoch(epoch)
        return self.sampler.batches()

    def batch_size(self, batch: Sequence[int]) -> tuple[int, int]:
        tokens = sum(self.train_set.target_lens[i] for i in batch)
        return tokens, sum(self.train_set.num_frames[i] for i in batch)

    def loader(
        self, batches: list[list[int]], dist: distributed.DistContext, generator: torch.Generator
    ) -> torch.utils.data.DataLoader:
        """This process's shards of ``batches``, loaded in ``data.num_workers`` worker processes."""
        workers = self.data.num_workers
        return torch.utils.data.DataLoader(
            self.train_set,
            batch_sampler=[shard(b, dist.rank, dist.world_size) for b in batches],
            collate_fn=collate,
            num_workers=workers,
            generator=generator,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=4 if workers else None,
        )

    def forward(self, model: torch.nn.Module, batch: Batch) -> TaskOutput | None:
        if not batch.ids:
            return None
        batch = batch.to(self.device, non_blocking=True)
        extra = {}
        if batch.label_ends is not None:
            extra["label_ends"] = batch.label_end_frames(self.frame_period)
        out = model(batch.feats, batch.feat_lens, batch.targets, batch.target_lens, **extra)
        return TaskOutput(out.loss, out.nll, batch.ids, out.stats)

    @torch.no_grad()
    def validate(self, model: torch.nn.Module, autocast) -> dict:
        """Per-token loss and error rate on the validation split (shared among processes): the
        greedy search's, or a beam search's with ``trainer.valid_beam``."""
        model.eval()
        search = BeamSearchOptions(beam=self.options.valid_beam or 1)
        sampler = BucketBatchSampler(self.valid_set.num_frames, self.data.max_frames, shuffle=False)
        totals = {"nll": 0.0, "tokens": 0, "errors": 0, "ref_tokens": 0}
        stats, batches = {}, 0
        for indices in sampler.batches()[self.dist.rank :: self.dist.world_size]:
            batch = collate([self.valid_set[i] for i in indices]).to(self.device)
            if not batch.ids:
                continue
            with autocast():
                if self.options.valid_beam:  # the loss, and a beam search's hypotheses
                    out = model.loss(batch.feats, batch.feat_lens, batch.targets, batch.target_lens)
                    hyps = [
                        nbest[0].tokens if nbest else []
                        for nbest in beam_search(model, batch.feats, batch.feat_lens, search)
                    ]
                else:  # the loss and the greedy search on one encoder pass
                    out, hyps = model.validate_batch(
                        batch.feats, batch.feat_lens, batch.targets, batch.target_lens
                    )
            refs = [y[:n].tolist() for y, n in zip(batch.targets, batch.target_lens.tolist())]
            counts = error_counts(
                [self.vocab.decode(r) for r in refs], [self.vocab.decode(h) for h in hyps]
            )
            totals["nll"] += float(out.nll.sum())
            totals["tokens"] += int(batch.target_lens.sum())
            totals["errors"] += counts["errors"]
            totals["ref_tokens"] += counts["ref_tokens"]
            for key, value in out.stats.items():
                stats[key] = stats.get(key, 0.0) + float(value)
            batches += 1
        nll, tokens, errors, ref_tokens = distributed.all_reduce_sum(
            list(totals.values()), self.dist, self.device
        )
        metrics = {
            "valid_loss": nll / max(tokens, 1),
            "valid_error_rate": 100.0 * errors / max(ref_tokens, 1),
        }
        # this process's statistics
        metrics.update({f"valid_{key}": value / batches for key, value in stats.items()})
        return metrics

    def epoch_metrics(self, metrics: dict) -> dict:
        return {}

    def checkpoint_extras(self) -> dict:
        return {"config": plain(self.cfg)}

    def upgrade(self, ckpt: dict) -> dict:
        """A checkpoint whose config holds an option since removed
        (:data:`cbasr.config.upgrade.REMOVED_KEYS`) without it, so that the run resumes."""
        if "config" in ckpt:
            drop_removed_keys(ckpt["config"])
        return ckpt

    def check_resumed(self, ckpt: dict) -> None:
        try:
            then = _settings(ckpt["config"])
        except ValueError as e:
            raise ValueError(
                f"{self.exp_dir}: the checkpoint's config is not valid today ({e}); "
                "use a new exp_dir"
            ) from None
        now = _settings(plain(self.cfg))
        changed = [k for k in MODEL_KEYS if then[k] != now[k]]
        if changed:
            raise ValueError(
                f"{self.exp_dir} holds a run with different {changed}; "
                "use a new exp_dir or restore those settings"
            )
        moved = [k for k in BATCH_KEYS if then[k] != now[k]]
        if moved:
            log.warning(
                "%s changed since the checkpoint: the rest of this epoch uses different batches",
                moved,
            )

    def start_new_run(self, model: torch.nn.Module) -> None:
        """Fine-tuning: start from ``trainer.init_from``'s weights when it names a model."""
        options = self.options
        if options.init_from:
            load_initial_weights(model, options.init_from, list(options.init_skip), self.vocab)


def asr_trainer(
    cfg: TrainConfig | dict,
    exp_dir: str | Path | None = None,
    dist_ctx: distributed.DistContext | None = None,
) -> Trainer:
    """The loop on the acoustic model of ``cfg`` in ``exp_dir`` (default ``cfg.exp_dir``).
    ``cfg`` as ``cbasr-train`` composes it, typed; a plain one (from Python, or an old
    ``config.json``) is typed here, a bad entry a ``ValueError`` naming it."""
    if not isinstance(cfg, TrainConfig):
        cfg = typed(TrainConfig, today_s_keys(cfg), "")
    exp_dir = Path(exp_dir if exp_dir is not None else cfg.exp_dir)
    return Trainer(AsrTask(cfg, exp_dir), cfg.trainer, cfg.optim, exp_dir, dist_ctx)


def train(cfg: TrainConfig | dict, exp_dir: str | Path | None = None) -> Trainer:
    """Train (or resume) the acoustic model of ``cfg`` in ``exp_dir`` (default
    ``cfg.exp_dir``)."""
    return run(asr_trainer(cfg, exp_dir))
