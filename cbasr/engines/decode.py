"""Decode a split with a trained experiment and write sclite ``trn`` files."""

import json
import logging
from pathlib import Path

import torch

from cbasr.builder import build_model
from cbasr.data.batching import BucketBatchSampler
from cbasr.data.features import FeatureStore, load_cmvn
from cbasr.data.manifest import read_manifest
from cbasr.data.vocab import Vocabulary, tokens_of
from cbasr.engines.checkpoint import load_checkpoint
from cbasr.engines.scoring import write_trn
from cbasr.fileio import write_json, write_text

__all__ = ["Experiment", "decode_split", "is_decoded"]

log = logging.getLogger(__name__)


class Experiment:
    """A trained model with its vocabulary and feature normalisation, from an experiment dir."""

    def __init__(self, exp_dir: str | Path, checkpoint: str = "best", device: str | torch.device = "cpu"):
        self.exp_dir = Path(exp_dir)
        path = self.exp_dir / "checkpoints" / f"{checkpoint}.pt"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: has {self.exp_dir} been trained?")
        ckpt = load_checkpoint(path, device)
        self.cfg = ckpt["config"]
        self.epoch = ckpt["state"]["epoch"]
        self.checkpoint = checkpoint
        self.checkpoint_stamp = f"{path.stat().st_mtime_ns}:{path.stat().st_size}"
        self.vocab = Vocabulary.load(self.exp_dir / "vocab.txt")
        self.cmvn = load_cmvn(self.exp_dir / "cmvn.json")
        self.device = torch.device(device)
        self.model = build_model(self.cfg["encoder"], self.cfg["decoder"], self.cfg["loss"],
                                 input_dim=self.cmvn[0].numel(), vocab_size=len(self.vocab))
        self.model.load_state_dict(ckpt["model"])
        self.model.to(self.device).eval()

    @property
    def units(self) -> str:
        return self.cfg["data"]["units"]


def is_decoded(exp: Experiment, out_dir: str | Path) -> bool:
    """Whether ``out_dir`` already holds this checkpoint's complete decoding."""
    info = Path(out_dir) / "decode.json"
    return info.is_file() and json.loads(info.read_text()).get("checkpoint_stamp") == exp.checkpoint_stamp


@torch.no_grad()
def decode_split(exp: Experiment, manifest: str | Path, feature_dir: str | Path, out_dir: str | Path,
                 max_frames: int = 20000) -> dict:
    """Greedy-decode every utterance of ``manifest`` into ``out_dir/{hyp,ref}.trn``.

    Utterances without features (unreadable audio) cannot be decoded: they are listed in
    ``out_dir/skipped.tsv``, counted in the returned summary and in ``decode.json``, and
    left out of both trn files, so the score says on how many utterances it was computed.
    """
    out_dir = Path(out_dir)
    store = FeatureStore(feature_dir)
    records = read_manifest(manifest)
    usable = [r for r in records if r["id"] in store]
    skipped = [r["id"] for r in records if r["id"] not in store]
    for utt_id in skipped:
        log.warning("cannot decode %s: no features", utt_id)
    lengths = [store.num_frames(r["id"]) for r in usable]
    mean, std = exp.cmvn
    hyps: dict[str, list[str]] = {}
    for indices in BucketBatchSampler(lengths, max_frames, shuffle=False):
        feats = [(store[usable[i]["id"]] - mean) / std for i in indices]
        lens = torch.tensor([f.shape[0] for f in feats])
        padded = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        for i, hyp in zip(indices, exp.model.greedy_decode(padded.to(exp.device), lens.to(exp.device))):
            hyps[usable[i]["id"]] = exp.vocab.decode(hyp)
    write_trn(out_dir / "hyp.trn", [(r["id"], hyps[r["id"]]) for r in usable])
    write_trn(out_dir / "ref.trn", [(r["id"], tokens_of(r, exp.units)) for r in usable])
    write_text(out_dir / "skipped.tsv", "".join(f"{u}\tno features\n" for u in skipped))
    summary = {"manifest": str(manifest), "checkpoint": exp.checkpoint, "epoch": exp.epoch,
               "checkpoint_stamp": exp.checkpoint_stamp, "search": "greedy", "utts": len(usable),
               "skipped": len(skipped)}
    write_json(out_dir / "decode.json", summary)
    return summary
