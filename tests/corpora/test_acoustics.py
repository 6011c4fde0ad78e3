"""Room and noise: SNR over the active samples, 1/f noise, the impulse response's decay and DRR."""

import numpy as np
import pytest

from cbasr.corpora.synth.acoustics import (
    mix_at_snr,
    pink_noise,
    reverberate,
    room_impulse_response,
    white_noise,
)


def test_mix_at_snr_measures_the_active_samples():
    rng = np.random.default_rng(0)
    speech = np.zeros(16000)
    speech[4000:12000] = 0.3 * rng.standard_normal(8000)
    active = speech != 0
    noise = white_noise(rng, 16000)
    mixed = mix_at_snr(speech, noise, 7.5, active)
    added = mixed - speech
    snr = 10 * np.log10(np.mean(speech[active] ** 2) / np.mean(added**2))
    assert snr == pytest.approx(7.5, abs=1e-9)


def test_pink_noise_falls_3_db_per_octave():
    noise = pink_noise(np.random.default_rng(1), 2**18 + 5)  # not a power of two
    assert len(noise) == 2**18 + 5
    assert noise.mean() == pytest.approx(0, abs=1e-9) and noise.std() == pytest.approx(1)
    power = np.abs(np.fft.rfft(noise)) ** 2
    freqs = np.fft.rfftfreq(len(noise), 1 / 16000)
    bands = [10 * np.log10(power[(freqs >= f) & (freqs < 2 * f)].mean()) for f in (125, 500, 2000)]
    assert np.diff(bands) == pytest.approx([-6.0, -6.0], abs=0.5)  # two octaves apart


def test_impulse_response_decays_60_db_in_rt60_and_keeps_its_drr():
    rng = np.random.default_rng(2)
    response = room_impulse_response(rng, rt60=0.5, drr_db=4.0)
    assert len(response) == 8001 and response[0] == 1.0
    tail = response[1:]
    assert 10 * np.log10(1.0 / np.sum(tail**2)) == pytest.approx(4.0)
    # Schroeder's backward integral: the energy decay curve, fitted from -5 to -25 dB
    decay = 10 * np.log10(np.cumsum(tail[::-1] ** 2)[::-1] / np.sum(tail**2))
    fit = (decay < -5) & (decay > -25)
    slope = np.polyfit(np.flatnonzero(fit) / 16000, decay[fit], 1)[0]  # dB per second
    assert -60 / slope == pytest.approx(0.5, rel=0.1)


def test_reverberate_is_the_convolution_cut_to_length():
    rng = np.random.default_rng(3)
    signal, response = rng.standard_normal(1001), room_impulse_response(rng, 0.05, 0.0)
    expected = np.convolve(signal, response)[:1001]
    np.testing.assert_allclose(reverberate(signal, response), expected, atol=1e-10)
