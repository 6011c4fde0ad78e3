"""Training-time augmentation: SpecAugment and speed perturbation.

Every random choice comes from an explicit ``torch.Generator``. The training dataset seeds one
per ``(seed, epoch, utterance)`` (:func:`utterance_generator`), so an utterance's augmentation
depends neither on the worker process that loads it, nor on the rank that trains on it, nor on
where a resumed run picked up: resume stays exact and a multi-process run sees the same data as
a single-process one.

Speed perturbation exists at two levels:

- on the waveform (features computed on the fly): the audio is resampled as if it had been
  recorded at ``factor`` times the sample rate, so tempo and pitch both change by ``factor``
  (Kaldi's and ESPnet's 3-way speed perturbation, Ko et al., 2015);
- on cached filterbank frames: the frame sequence is linearly interpolated to ``T / factor``
  frames. Duration changes as on the waveform, the spectrum does not (tempo only, like
  ``sox tempo``). It costs nothing and keeps features cached; use on-the-fly features when the
  pitch change matters.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torchaudio

__all__ = [
    "Augmentation",
    "spec_augment",
    "resample_frames",
    "speed_perturb_waveform",
    "utterance_generator",
    "perturbed_frames",
]


def utterance_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A CPU generator seeded from ``(seed, epoch, index)`` only."""
    state = np.random.SeedSequence([seed, epoch, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _randint(high: int, generator: torch.Generator) -> int:
    """Uniform integer in ``[0, high]`` (inclusive)."""
    return int(torch.randint(0, high + 1, (), generator=generator))


def spec_augment(
    feats: torch.Tensor,
    generator: torch.Generator,
    freq_masks: int = 2,
    freq_mask_width: int = 27,
    time_masks: int = 2,
    time_mask_width: int = 40,
    time_mask_ratio: float = 0.2,
) -> torch.Tensor:
    """Frequency and time masking of SpecAugment (Park et al., 2019, section 2; no time warping).

    Each frequency mask zeroes ``f`` consecutive mel bins, ``f`` uniform in
    ``[0, freq_mask_width]``; each time mask zeroes ``t`` consecutive frames, ``t`` uniform in
    ``[0, min(time_mask_width, time_mask_ratio * T)]``. Masks may overlap. Zero is the mean of
    CMVN-normalised features, the paper's mask value.

    Args:
        feats: ``(T, F)`` normalised features (not modified).

    Returns:
        ``(T, F)`` masked copy.
    """
    num_frames, num_bins = feats.shape
    out = feats.clone()
    for _ in range(freq_masks):
        width = _randint(min(freq_mask_width, num_bins), generator)
        start = _randint(num_bins - width, generator)
        out[:, start : start + width] = 0
    longest = min(time_mask_width, int(time_mask_ratio * num_frames))
    for _ in range(time_masks):
        width = _randint(longest, generator)
        start = _randint(num_frames - width, generator)
        out[start : start + width] = 0
    return out


def perturbed_frames(num_frames: int, factor: float) -> int:
    """Frames that :func:`resample_frames` gives for ``num_frames`` at speed ``factor``."""
    return max(1, round(num_frames / factor))


def resample_frames(feats: torch.Tensor, factor: float) -> torch.Tensor:
    """Speed perturbation of cached features: ``(T, F) -> (round(T / factor), F)`` by linear interpolation.

    ``factor > 1`` is faster speech (fewer frames). Tempo only: the spectrum is unchanged.
    """
    if factor == 1.0:
        return feats
    frames = perturbed_frames(feats.shape[0], factor)
    x = feats.t().unsqueeze(0)  # (T, F) -> (1, F, T)
    x = torch.nn.functional.interpolate(x, size=frames, mode="linear", align_corners=True)
    return x.squeeze(0).t().contiguous()  # (1, F, T') -> (T', F)


def speed_perturb_waveform(waveform: torch.Tensor, sample_rate: int, factor: float) -> torch.Tensor:
    """Speed perturbation of audio: ``(N,) -> (about N / factor,)``; tempo and pitch scale by ``factor``.

    The samples are read as if recorded at ``factor * sample_rate`` and resampled to
    ``sample_rate`` (Ko et al., 2015; Kaldi's ``sox speed``).
    """
    if factor == 1.0:
        return waveform
    return torchaudio.functional.resample(waveform, int(round(sample_rate * factor)), sample_rate)


@dataclass(frozen=True)
class Augmentation:
    """What the training dataset does to each utterance (picklable, for worker processes).

    Args:
        speed_factors: speed perturbation draws one of these per utterance and epoch
            (uniformly); empty: off.
        freq_masks, freq_mask_width, time_masks, time_mask_width, time_mask_ratio: SpecAugment
            (see :func:`spec_augment`); no masks: off.

    The values are the ``data`` group's, whose schema checks them (factors > 0, counts and
    widths >= 0, the ratio in ``[0, 1]``: :class:`~cbasr.config.schema.DataConfig`).
    """

    speed_factors: tuple[float, ...] = ()
    freq_masks: int = 0
    freq_mask_width: int = 27
    time_masks: int = 0
    time_mask_width: int = 40
    time_mask_ratio: float = 0.2

    @property
    def masks(self) -> bool:
        return self.freq_masks > 0 or self.time_masks > 0

    def draw_speed(self, generator: torch.Generator) -> float:
        """The speed factor for one utterance (1.0 when speed perturbation is off)."""
        if not self.speed_factors:
            return 1.0
        return self.speed_factors[_randint(len(self.speed_factors) - 1, generator)]

    def mask(self, feats: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """SpecAugment's masks on ``(T, F)`` normalised features (unchanged when off)."""
        if not self.masks:
            return feats
        return spec_augment(
            feats,
            generator,
            self.freq_masks,
            self.freq_mask_width,
            self.time_masks,
            self.time_mask_width,
            self.time_mask_ratio,
        )
