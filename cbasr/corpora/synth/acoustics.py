"""Room and noise for synthetic speech: reverberation, coloured noise, mixing at a given SNR.

Everything takes a ``numpy.random.Generator`` and returns float64 arrays, so an utterance's
acoustics are a function of its seed. Signals are ``(N,)`` samples at 16 kHz.

- :func:`room_impulse_response`: a direct path followed, after a few milliseconds, by a
  diffuse tail of Gaussian noise under an exponential envelope whose energy falls by 60 dB
  in ``rt60`` seconds (the usual statistical model of late reverberation: Polack, 1993,
  "La transmission de l'énergie sonore dans les salles", thesis, Université du Maine), the
  tail scaled to a direct-to-reverberant energy ratio ``drr_db``;
- :func:`reverberate`: the convolution, cut to the dry signal's length, so the dry signal's
  word times still hold (by FFTs of a power-of-two length, where
  ``torchaudio.functional.fftconvolve`` transforms at the exact output length, often a large
  prime factor: recipes/digits/RESULTS.md, "Measurements behind defaults");
- :func:`white_noise`, :func:`pink_noise` (power falling 3 dB per octave, shaped in the
  frequency domain);
- :func:`mix_at_snr`: noise scaled so that the power of the speech over its active samples
  (the words, not the gaps between them) is ``snr_db`` above the noise's mean power. Gaps
  make up a third of a connected-digit utterance, so this is about 2 dB harder than an SNR
  over the whole file (``torchaudio.functional.add_noise``'s definition).
"""

import numpy as np

__all__ = ["mix_at_snr", "pink_noise", "reverberate", "room_impulse_response", "white_noise"]

SAMPLE_RATE = 16000
_PRE_DELAY = 0.004  # seconds between the direct path and the diffuse tail


def room_impulse_response(
    rng: np.random.Generator, rt60: float, drr_db: float, sample_rate: int = SAMPLE_RATE
) -> np.ndarray:
    """A synthetic impulse response ``(N,)``, ``N = round(rt60 * sample_rate) + 1``: 1 at sample 0.

    Args:
        rt60: seconds for the tail's energy to fall by 60 dB.
        drr_db: direct-to-reverberant energy ratio in dB (0: as much energy in the tail as in
            the direct path).
    """
    length = int(round(rt60 * sample_rate))
    t = np.arange(length) / sample_rate
    # energy exp(-t ln(10^6) / rt60): amplitude decays at half that rate
    tail = rng.standard_normal(length) * np.exp(-t * np.log(1e6) / (2 * rt60))
    tail[: int(_PRE_DELAY * sample_rate)] = 0.0
    tail *= np.sqrt(10 ** (-drr_db / 10) / np.sum(tail**2))
    return np.concatenate([[1.0], tail])


def reverberate(signal: np.ndarray, response: np.ndarray) -> np.ndarray:
    """``signal`` convolved with ``response``, cut to ``len(signal)`` samples."""
    size = _fast_length(len(signal) + len(response) - 1)
    wet = np.fft.irfft(np.fft.rfft(signal, size) * np.fft.rfft(response, size), size)
    return wet[: len(signal)]


def white_noise(rng: np.random.Generator, length: int) -> np.ndarray:
    """Unit-variance Gaussian white noise ``(length,)``."""
    return rng.standard_normal(length)


def pink_noise(rng: np.random.Generator, length: int) -> np.ndarray:
    """Unit-variance noise ``(length,)`` whose power spectral density falls as ``1 / f``."""
    size = _fast_length(length)
    spectrum = np.fft.rfft(rng.standard_normal(size))
    frequencies = np.arange(len(spectrum), dtype=np.float64)
    frequencies[0] = 1.0  # keep the mean (it is removed below) from dividing by zero
    noise = np.fft.irfft(spectrum / np.sqrt(frequencies), n=size)[:length]
    noise -= noise.mean()
    return noise / noise.std()


def _fast_length(length: int) -> int:
    """The smallest power of two at least ``length``: a fast FFT size."""
    return 1 << max(0, length - 1).bit_length()


def mix_at_snr(
    speech: np.ndarray, noise: np.ndarray, snr_db: float, active: np.ndarray
) -> np.ndarray:
    """``speech + g * noise``, ``g`` such that the SNR over the active samples is ``snr_db``.

    Args:
        speech, noise: ``(N,)``.
        snr_db: speech power over ``active`` against the noise's mean power, in dB.
        active: ``(N,)`` bool, the samples where the speech is (the words).
    """
    speech_power = np.mean(speech[active] ** 2)
    noise_power = np.mean(noise**2)
    gain = np.sqrt(speech_power / (noise_power * 10 ** (snr_db / 10)))
    return speech + gain * noise
