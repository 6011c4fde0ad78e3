"""A trained experiment, loaded for inference: the model of its ``best`` (or any) checkpoint with
its vocabulary and feature normalisation (:class:`Experiment`), and what reading its outputs in
time needs (:func:`subsampling_stride`, :func:`frame_shift_seconds`). Decoding, alignment,
export and the recogniser all start here; the device comes from :func:`cbasr.devices.select_device`.
"""

import json
from pathlib import Path

import torch

from cbasr.builder import build_model, model_configs
from cbasr.data.features import normalise, utterance_mean_of
from cbasr.data.source_tokens import experiment_input
from cbasr.data.vocab import Vocabulary
from cbasr.models.base import subsampling_stride
from cbasr.storage.checkpoint import load_checkpoint

__all__ = ["Experiment", "MAX_FRAMES", "subsampling_stride", "frame_shift_seconds", "frame_seconds"]


MAX_FRAMES = 20000  # padded input frames per batch when decoding, aligning or transcribing


class Experiment:
    """A trained model with its vocabulary and feature normalisation, from an experiment dir.

    ``checkpoint`` is a name in ``<exp_dir>/checkpoints/`` (``best``, ``last``, ``averaged``,
    ``epoch-N``) or the path of a ``.pt`` file.
    """

    def __init__(
        self, exp_dir: str | Path, checkpoint: str = "best", device: str | torch.device = "cpu"
    ):
        self.exp_dir = Path(exp_dir)
        if not self.exp_dir.is_dir():
            raise FileNotFoundError(f"{self.exp_dir}: no such experiment directory")
        path = self.exp_dir / "checkpoints" / f"{checkpoint}.pt"
        if checkpoint.endswith(".pt"):  # a checkpoint file of this experiment's model
            path = Path(checkpoint)
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: has {self.exp_dir} been trained?")
        ckpt = load_checkpoint(path, device)
        self.cfg = ckpt["config"]
        self.epoch = ckpt["state"]["epoch"]
        self.checkpoint = checkpoint
        self.checkpoint_stamp = f"{path.stat().st_mtime_ns}:{path.stat().st_size}"
        self.vocab = Vocabulary.load(self.exp_dir / "vocab.txt")
        input_dim, self.cmvn = experiment_input(self.exp_dir)  # cmvn None: text input (source ids)
        self.device = torch.device(device)
        self.model = build_model(
            *model_configs(self.cfg),
            input_dim=input_dim,
            vocab_size=len(self.vocab),
        )
        self.model.load_state_dict(ckpt["model"])
        self.model.to(self.device).eval()

    @property
    def units(self) -> str:
        return self.cfg["data"]["units"]

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def normalise(self, feats: torch.Tensor) -> torch.Tensor:
        """CMVN of filterbank features; source ids of a text input pass unchanged."""
        if self.cmvn is None:
            return feats
        return normalise(feats, *self.cmvn, utterance_mean_of(self.cfg))


def frame_shift_seconds(feature_dir: str | Path) -> float:
    """The feature frame shift of a feature directory (its ``.done`` record), 10 ms if unrecorded."""
    return frame_seconds(feature_dir)[0]


def frame_seconds(feature_dir: str | Path) -> tuple[float, float]:
    """The feature frame shift and window length of a feature directory (its ``.done``
    record), 10 and 25 ms if unrecorded."""
    done = Path(feature_dir) / ".done"
    params = json.loads(done.read_text()).get("params", {}) if done.is_file() else {}
    return params.get("frame_shift_ms", 10.0) / 1000.0, params.get("frame_length_ms", 25.0) / 1000.0
