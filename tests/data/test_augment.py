import numpy as np
import pytest
import torch

from cbasr.data.augment import (
    Augmentation,
    resample_frames,
    spec_augment,
    speed_perturb_waveform,
    utterance_generator,
)


def _bands(mask: torch.Tensor) -> list[int]:
    """Lengths of the runs of True in a 1-D boolean mask."""
    runs, n = [], 0
    for m in mask.tolist() + [False]:
        if m:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def test_masks_have_the_configured_sizes():
    feats = torch.randn(300, 80) + 10  # no zeros of its own
    widest_f = widest_t = 0
    for seed in range(200):
        out = spec_augment(
            feats,
            torch.Generator().manual_seed(seed),
            freq_masks=1,
            freq_mask_width=27,
            time_masks=1,
            time_mask_width=100,
            time_mask_ratio=0.2,
        )
        zero = out == 0
        freq, time = zero.all(0), zero.all(1)  # masked bins are zero in every frame, and vice versa
        assert torch.equal(zero, freq.unsqueeze(0) | time.unsqueeze(1))  # nothing else is touched
        assert torch.equal(out[~zero], feats[~zero])
        assert len(_bands(freq)) <= 1 and len(_bands(time)) <= 1
        widest_f, widest_t = max([widest_f, *_bands(freq)]), max([widest_t, *_bands(time)])
    assert widest_f == 27  # widths reach their bound and never pass it
    assert widest_t == 60  # min(time_mask_width, time_mask_ratio * T)


def test_masks_are_a_function_of_the_generator_seed():
    feats = torch.randn(120, 40)
    a = spec_augment(feats, utterance_generator(1, 2, 3))
    assert torch.equal(a, spec_augment(feats, utterance_generator(1, 2, 3)))
    assert not torch.equal(a, spec_augment(feats, utterance_generator(1, 3, 3)))  # another epoch
    assert not torch.equal(a, feats)


def test_feature_level_speed_perturbation_changes_the_length_by_the_factor():
    ramp = (
        torch.arange(200, dtype=torch.float32).unsqueeze(1).repeat(1, 3)
    )  # (T, F), linear in time
    for factor, frames in ((0.9, 222), (1.1, 182), (1.0, 200)):
        out = resample_frames(ramp, factor)
        assert out.shape == (frames, 3)
        torch.testing.assert_close(
            out[:, 0], torch.linspace(0, 199, frames)
        )  # interpolated, not cropped


def test_waveform_speed_perturbation_changes_tempo_and_pitch():
    sr = 16000
    tone = torch.sin(2 * torch.pi * 1000 * torch.arange(sr) / sr)  # 1 s at 1 kHz
    fast = speed_perturb_waveform(tone, sr, 1.1)
    assert abs(fast.numel() - sr / 1.1) <= 1
    spectrum = np.abs(np.fft.rfft(fast.numpy()))
    assert np.argmax(spectrum) * sr / fast.numel() == pytest.approx(1100, abs=2)


def test_augmentation_draws_speeds_from_the_list():
    aug = Augmentation(speed_factors=(0.9, 1.0, 1.1))
    draws = {aug.draw_speed(utterance_generator(0, 0, i)) for i in range(50)}
    assert draws == {0.9, 1.0, 1.1}
    assert Augmentation().draw_speed(torch.Generator()) == 1.0
    assert torch.equal(Augmentation().mask(torch.ones(5, 4), torch.Generator()), torch.ones(5, 4))
