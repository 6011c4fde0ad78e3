"""Audio reading: a truncated file is an error naming it, never a shorter utterance."""

import numpy as np
import pytest
import soundfile

from cbasr.data.audio import AudioError, read_audio


def _wav(path, seconds=0.5, rate=16000, **kw):
    samples = np.sin(np.arange(int(seconds * rate)) / 5.0).astype(np.float32) * 0.5
    soundfile.write(path, samples, rate, **kw)
    return samples


def test_a_complete_wav_reads_back(tmp_path):
    samples = _wav(tmp_path / "a.wav", subtype="PCM_16")
    read, rate = read_audio(tmp_path / "a.wav")
    assert rate == 16000 and read.shape == samples.shape
    np.testing.assert_allclose(read, samples, atol=1e-4)


@pytest.mark.parametrize("subtype", ["PCM_16", "FLOAT"])
def test_a_truncated_riff_wav_is_an_error_naming_the_file(tmp_path, subtype):
    path = tmp_path / "cut.wav"
    _wav(path, subtype=subtype)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(AudioError, match=r"cut.wav: truncated: the RIFF header promises \d+ bytes"):
        read_audio(path)


def test_a_streamed_wav_without_sizes_is_read(tmp_path):
    path = tmp_path / "stream.wav"
    samples = _wav(path, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    at = data.index(b"data")
    data[at + 4 : at + 8] = (0xFFFFFFFF).to_bytes(4, "little")  # as a pipe writer leaves it
    path.write_bytes(bytes(data))
    read, _ = read_audio(path)
    assert read.shape == samples.shape
