"""Reading audio of any corpus: WAV/FLAC/SPHERE PCM through libsndfile, Shorten-compressed
SPHERE (WSJ's ``.wv1``) through ffmpeg.

libsndfile reads PCM SPHERE in both byte orders but not Shorten; ffmpeg has the ``nistsphere``
demuxer and a Shorten decoder. It runs as a subprocess piping raw PCM back (pydub would need
``ffprobe`` too, which the wheel lacks), from the ``imageio-ffmpeg`` wheel (or the binary
named by ``$CBASR_FFMPEG``), so no system package is needed.
A file shorter than its SPHERE header (or its RIFF ``data`` chunk) says is reported as
truncated, never read as a shorter utterance: libsndfile itself would read what is there.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import soundfile

from cbasr.data.sphere import SphereError, expected_pcm_bytes, is_shorten, read_header

__all__ = ["AudioError", "read_audio", "read_audio_channels", "read_segment", "ffmpeg_binary"]


class AudioError(ValueError):
    """Unreadable, truncated or undecodable audio; the message names the file."""


def ffmpeg_binary() -> str:
    """An ffmpeg with the Shorten decoder: ``$CBASR_FFMPEG``, else imageio-ffmpeg's."""
    if os.environ.get("CBASR_FFMPEG"):
        return os.environ["CBASR_FFMPEG"]
    try:
        import imageio_ffmpeg
    except ImportError as e:
        raise AudioError(
            "decoding Shorten-compressed SPHERE (WSJ .wv1) needs ffmpeg: pip install "
            "imageio-ffmpeg, or set CBASR_FFMPEG to an ffmpeg built with the shorten "
            "decoder"
        ) from e
    return imageio_ffmpeg.get_ffmpeg_exe()


def _read_shorten(path: Path, header: dict) -> tuple[np.ndarray, int]:
    """Decode through ffmpeg's nistsphere demuxer and Shorten decoder to 16-bit PCM."""
    command = [
        ffmpeg_binary(),
        "-nostdin",
        "-v",
        "error",
        "-f",
        "nistsphere",
        "-i",
        str(path),
        "-map",
        "0:a:0",
        "-f",
        "s16le",
        "-acodec",
        "pcm_s16le",
        "-",
    ]
    run = subprocess.run(command, capture_output=True)
    if run.returncode != 0:
        raise AudioError(
            f"{path}: ffmpeg could not decode the Shorten stream (truncated or damaged file): "
            f"{run.stderr.decode(errors='replace').strip()[-300:]}"
        )
    channels = header.get("channel_count", 1)
    samples = np.frombuffer(run.stdout, dtype="<i2").reshape(-1, channels)
    return samples.astype(np.float32) / 32768.0, header.get("sample_rate", 16000)


def riff_truncation(path: Path) -> str | None:
    """Why a RIFF WAV is shorter than its ``data`` chunk header promises, or None (not RIFF, or
    complete, or a streamed file whose sizes were never filled in: 0 or 0xFFFFFFFF)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        offset = 12
        while offset + 8 <= size:
            f.seek(offset)
            chunk = f.read(8)
            chunk_size = int.from_bytes(chunk[4:8], "little")
            if chunk[:4] == b"data":
                if chunk_size in (0, 0xFFFFFFFF):
                    return None
                end = offset + 8 + chunk_size
                if size < end:
                    return (
                        f"truncated: the RIFF header promises {chunk_size} bytes of samples, "
                        f"the file holds {size - offset - 8}"
                    )
                return None
            offset += 8 + chunk_size + (chunk_size & 1)  # chunks are word-aligned
    return None


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """``(samples (N,) float32 in [-1, 1], sample rate)`` of the first channel of ``path``.

    Raises:
        AudioError: as :func:`read_audio_channels`.
    """
    samples, rate = read_audio_channels(path)
    return np.ascontiguousarray(samples[:, 0]), rate


def read_audio_channels(path: str | Path) -> tuple[np.ndarray, int]:
    """``(samples (N, C) float32 in [-1, 1], sample rate)``: every channel of ``path``, which is
    read by its content (SPHERE, RIFF WAV, FLAC, ...), whatever its extension.

    Raises:
        AudioError: missing, unreadable, truncated (fewer samples than the SPHERE header's
            ``sample_count`` or the RIFF ``data`` chunk's size) or undecodable files, naming
            the path.
    """
    path = Path(path)
    if not path.is_file():
        raise AudioError(f"{path}: no such audio file")
    header = None
    with open(path, "rb") as f:
        if f.read(7) == b"NIST_1A":
            try:
                header = read_header(path)
            except SphereError as e:
                raise AudioError(str(e)) from e
    if header is not None and is_shorten(header):
        samples, rate = _read_shorten(path, header)
    else:
        expected = None if header is None else expected_pcm_bytes(header)
        if expected is not None and path.stat().st_size < expected:
            raise AudioError(
                f"{path}: truncated: the SPHERE header promises {header['sample_count']} samples "
                f"({expected} bytes), the file has {path.stat().st_size} bytes"
            )
        truncated = riff_truncation(path) if header is None else None
        if truncated:
            raise AudioError(f"{path}: {truncated}")
        try:
            samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
        except Exception as e:  # soundfile raises several types for corrupt files
            raise AudioError(f"{path}: unreadable audio: {type(e).__name__}: {e}") from e
    if (
        header is not None
        and "sample_count" in header
        and samples.shape[0] < header["sample_count"]
    ):
        raise AudioError(
            f"{path}: truncated: the SPHERE header promises {header['sample_count']} samples, "
            f"{samples.shape[0]} could be decoded"
        )
    return samples, rate


def read_segment(
    path: str | Path,
    start: float | None = None,
    duration: float | None = None,
    channel: int = 0,
) -> tuple[np.ndarray, int]:
    """Channel ``channel`` of ``path`` from ``start`` seconds for ``duration`` seconds (a Kaldi
    ``segments`` entry, a lhotse supervision; None: the whole file).

    Raises:
        AudioError: as :func:`read_audio`, a channel the file does not have, or a segment that
            ends beyond the recording.
    """
    if channel == 0:
        samples, rate = read_audio(path)
    else:
        every, rate = read_audio_channels(path)
        if not 0 <= channel < every.shape[1]:
            raise AudioError(f"{path}: no channel {channel} (the file has {every.shape[1]})")
        samples = np.ascontiguousarray(every[:, channel])
    if start is None:
        return samples, rate
    first = int(round(start * rate))
    last = len(samples) if duration is None else first + int(round(duration * rate))
    if first < 0 or last > len(samples) + 1 or first >= last:  # one sample of rounding slack
        raise AudioError(
            f"{path}: segment {start:.3f} s + {duration} s lies outside the recording "
            f"({len(samples) / rate:.3f} s)"
        )
    return samples[first:last], rate
