"""cbasr-transcribe: recognise audio files with a trained experiment directory.

    cbasr-transcribe --exp-dir exp/blstm_ctc a.wav b.flac c.sph     # path<TAB>hypothesis per file
    cbasr-transcribe --exp-dir exp/blstm_ctc --beam 8 --timestamps audio/   # a CTM of a directory
    find . -name '*.wav' | cbasr-transcribe --exp-dir exp/blstm_ctc -       # a list on stdin
    cbasr-transcribe --exp-dir exp/x --beam 8 --lm exp/lm --lm-weight 0.5 --list files.txt
    cbasr-transcribe --exp-dir exp/hat_ulstm --stream --chunk-ms 160 a.wav   # partials on stderr

WAV, FLAC and SPHERE (PCM or Shorten) are read by content at any sample rate (resampled to the
model's, with a note) and channel count (the first channel is recognised, with a note). A
directory stands for every audio file below it (by extension: .wav .flac .sph .wv1 .wv2, any
case), a list file (``--list FILE``, ``-`` for stdin) for the paths it lists, one per line.
Files that cannot be read are named on stderr and counted, and the exit status is then 1.
``--stream`` recognises each file as audio arriving in ``--chunk-ms`` pieces (a transducer with
a streaming encoder, a unidirectional LSTM or a chunked Conformer:
:meth:`cbasr.Recognizer.stream`), printing the partial hypothesis on
stderr whenever it changes and the final one, the offline hypothesis, on stdout.
"""

import argparse
import logging
import sys
from pathlib import Path

import torch
import torchaudio

from cbasr.cli.common import one_line_errors, setup_logging
from cbasr.data.audio import AudioError
from cbasr.inference.recognizer import Recognizer
from cbasr.progress import progress_bar

log = logging.getLogger("cbasr-transcribe")

AUDIO_SUFFIXES = {".wav", ".flac", ".sph", ".wv1", ".wv2", ".nist"}


def audio_files(args) -> list[Path]:
    """The files the command line names: files, directories (searched recursively for audio
    suffixes, sorted) and the lines of list files (``-``: stdin)."""
    paths: list[Path] = []
    lists = list(args.list)
    for item in args.audio:
        if item == "-":
            lists.append("-")
            continue
        path = Path(item)
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES
            )
            if not found:
                raise FileNotFoundError(f"{path}: no audio files ({', '.join(AUDIO_SUFFIXES)})")
            paths += found
        else:
            paths.append(path)
    for name in lists:
        if name == "-":
            lines = sys.stdin.read().splitlines()
        else:
            if not Path(name).is_file():
                why = "is not a file" if Path(name).exists() else "no such list file"
                raise FileNotFoundError(f"{name}: {why} (--list)")
            lines = Path(name).read_text(encoding="utf-8").splitlines()
        paths += [Path(line.strip()) for line in lines if line.strip()]
    if not paths:
        raise SystemExit("cbasr-transcribe: no audio given: name files, directories or --list")
    return paths


def _exit_if_failed(failed: int, total: int) -> None:
    """Count the files that could not be recognised (named above) and exit 1, if any."""
    if failed:
        print(
            f"cbasr-transcribe: {failed} of {total} files could not be recognised (named above)",
            file=sys.stderr,
        )
        sys.exit(1)


def stream_files(recognizer: Recognizer, paths: list[Path], chunk_ms: int) -> None:
    """Each file as a stream of ``chunk_ms`` pieces (its audio resampled to the model's rate
    first): ``PATH [partial] TEXT`` on stderr whenever the hypothesis changes, ``PATH<TAB>TEXT``
    on stdout at the end; files that cannot be read are named and counted (exit status 1)."""
    rate = recognizer.sample_rate
    size = max(1, rate * chunk_ms // 1000)
    failed = 0
    for path in paths:
        try:
            waveform, source_rate = recognizer._waveform(path, None)
            stream = recognizer.stream(str(path))
        except AudioError as error:
            print(f"cbasr-transcribe: {error}", file=sys.stderr)
            failed += 1
            continue
        if source_rate != rate:
            waveform = torchaudio.functional.resample(waveform, source_rate, rate)
        shown = ""
        for start in range(0, waveform.numel(), size):
            text = stream.accept(waveform[start : start + size]).text
            if text != shown:
                print(f"{path} [partial] {text}", file=sys.stderr, flush=True)
                shown = text
        print(f"{path}\t{stream.finish().text}", flush=True)
    _exit_if_failed(failed, len(paths))


@one_line_errors("cbasr-transcribe")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("audio", nargs="*", help="audio files, directories, or - (a list on stdin)")
    parser.add_argument("--exp-dir", required=True, type=Path, help="a cbasr-train experiment")
    parser.add_argument(
        "--list", action="append", default=[], metavar="FILE", help="a file listing audio paths"
    )
    parser.add_argument(
        "--checkpoint",
        default="best",
        help="best | last | averaged | a name in checkpoints/ | a .pt file",
    )
    parser.add_argument("--beam", type=int, default=0, help="beam width (0: greedy search)")
    parser.add_argument(
        "--lm",
        "--lm-dir",
        type=Path,
        default=None,
        help="external LM for shallow fusion: a cbasr-train-lm directory or an ARPA file",
    )
    parser.add_argument("--lm-weight", type=float, default=0.5)
    parser.add_argument(
        "--lm-words",
        action="store_true",
        help="--lm is an ARPA word model for a character or piece recogniser (word-end scoring)",
    )
    parser.add_argument("--label-bonus", type=float, default=0.0, help="added per label")
    parser.add_argument(
        "--timestamps",
        action="store_true",
        help="print a CTM (path 1 start duration token) from the model's alignment of its output",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="recognise each file as a stream of --chunk-ms pieces (a transducer with a "
        "streaming encoder): partial results on stderr as they change, the final on stdout",
    )
    parser.add_argument(
        "--chunk-ms", type=int, default=320, help="--stream: the audio pieces' length (ms)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--num-threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args(argv)
    setup_logging()
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    paths = audio_files(args)
    search = {"label_bonus": args.label_bonus} if args.label_bonus else {}
    recognizer = Recognizer.from_pretrained(
        args.exp_dir,
        args.checkpoint,
        args.device,
        beam=args.beam,
        lm=args.lm,
        lm_weight=args.lm_weight,
        lm_words=args.lm_words,
        **search,
    )
    if args.stream:
        if args.timestamps:
            raise SystemExit("cbasr-transcribe: --stream prints no CTM (--timestamps)")
        if args.chunk_ms < 1:
            raise SystemExit(f"cbasr-transcribe: --chunk-ms must be >= 1, got {args.chunk_ms}")
        stream_files(recognizer, paths, args.chunk_ms)
        return
    feats, names, failed = [], [], []
    for path in progress_bar(paths, "features", unit="file"):
        try:
            feats.append(recognizer.features_of(path))
            names.append(str(path))
        except (AudioError, ValueError) as error:
            print(f"cbasr-transcribe: {error}", file=sys.stderr)
            failed.append(path)
    results = recognizer.recognize(
        feats,
        names,
        timestamps=args.timestamps,
        progress=lambda batches: progress_bar(batches, "search", unit="batch"),
    )
    for result in results:
        if args.timestamps:
            for token, (start, duration) in zip(result.tokens, result.times):
                print(f"{result.source} 1 {start:.3f} {duration:.3f} {token}")
        else:
            print(f"{result.source}\t{result.text}")
    sys.stdout.flush()
    _exit_if_failed(len(failed), len(paths))


if __name__ == "__main__":
    main()
