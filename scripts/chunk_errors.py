"""Where in its chunk a streaming transducer errs: its greedy search's labels by the position of
the encoder frame that emitted them within the encoder's chunk, with the share of them that are
errors (substitutions and insertions, by the edit-distance alignment with the reference), and
the emission frame minus the gold end frame of each correct label.

If a chunked encoder's errors came from its missing look-ahead, labels emitted on a chunk's
last frames (no look-ahead) would be wrong more often than those emitted on its first (the rest
of the chunk ahead). ``--attend N`` decodes the same weights with attention chunks of ``N``
frames instead (``full``: the full context), to see what more context would give them.

    python scripts/chunk_errors.py --exp-dir exp/demo_hat_chunked --manifest data/synth/test.jsonl \\
        --features data/fbank/test [--attend full]
"""

import argparse
import collections
import contextlib
import sys

import jiwer
import torch

from cbasr.data.manifest import read_manifest
from cbasr.data.source_tokens import open_store
from cbasr.data.vocab import tokens_of
from cbasr.evaluation.delay import gold_ends
from cbasr.inference.experiment import Experiment, frame_seconds


def correct_labels(ref: list[str], hyp: list[str]) -> dict[int, int]:
    """Hypothesis position -> reference position of every correct label."""
    out = jiwer.process_words(" ".join(ref), " ".join(hyp))
    pairs = {}
    for chunk in out.alignments[0]:
        if chunk.type == "equal":
            for k in range(chunk.hyp_end_idx - chunk.hyp_start_idx):
                pairs[chunk.hyp_start_idx + k] = chunk.ref_start_idx + k
    return pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--features", required=True)
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument(
        "--chunk", type=int, default=0, help="bucket by this many frames (default: the encoder's)"
    )
    parser.add_argument(
        "--attend",
        default="",
        help="decode with attention chunks of this many frames, or 'full' (default: as trained)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    exp = Experiment(args.exp_dir, args.checkpoint)
    encoder = exp.model.encoder
    chunk = args.chunk or getattr(encoder, "chunk_size", 0)
    if not chunk:
        sys.exit(f"{args.exp_dir}: not a chunked encoder (encoder.chunk_size = 0): give --chunk")
    context = contextlib.nullcontext()
    if args.attend and not getattr(encoder, "chunked", False):
        sys.exit(f"{args.exp_dir}: --attend needs a chunked Conformer encoder")
    if args.attend == "full":
        context = encoder.full_context()
    elif args.attend:
        if not args.attend.isdigit() or int(args.attend) < 1:
            sys.exit(f"--attend takes a number of frames >= 1 or 'full', got {args.attend!r}")
        encoder.chunk_size = int(args.attend)
    store = open_store(args.features)
    shift, _ = frame_seconds(args.features)
    front = exp.model.encoder.subsampling
    if front is not None and not hasattr(front, "stride"):
        sys.exit(f"{args.exp_dir}: frame stacking or no front end only (the frames' times)")
    step = shift * (front.stride if front is not None else 1)  # seconds per encoder frame
    total, wrong, lag = collections.Counter(), collections.Counter(), collections.Counter()
    refs, hyps = [], []
    with context:
        for record in read_manifest(args.manifest):
            _tally(exp, store, record, chunk, step, (total, wrong, lag), refs, hyps)
    print(f"{args.exp_dir}: chunks of {chunk} encoder frames ({1000 * chunk * step:.0f} ms)")
    if args.attend:
        print(
            f"decoded attending to {'the full context' if args.attend == 'full' else f'chunks of {args.attend} frames'}"
        )
    errors = jiwer.process_words(refs, hyps) if refs else None
    if errors is not None:
        print(f"error rate: {100 * errors.wer:.2f}% of {sum(len(r.split()) for r in refs)} tokens")
    print("position in chunk | labels | errors (%)")
    for p in range(chunk):
        print(f"{p} | {total[p]} | {100 * wrong[p] / max(total[p], 1):.2f}")
    print("emission frame - gold end frame: labels")
    print(", ".join(f"{d}: {n}" for d, n in sorted(lag.items())))


def _tally(exp, store, record, chunk, step, counters, refs, hyps) -> None:
    """One utterance's greedy labels into ``counters`` (labels, errors per position in the
    chunk, emission - gold end), its reference and hypothesis onto ``refs`` and ``hyps``."""
    total, wrong, lag = counters
    if record["id"] not in store:
        return
    feats = exp.normalise(store[record["id"]]).unsqueeze(0)
    with torch.no_grad():
        found = exp.model.greedy_emissions(feats, torch.tensor([feats.shape[1]]))
    hyp, at = exp.vocab.decode(found.labels[0]), found.frames[0]
    ref = tokens_of(record, exp.units)
    refs.append(" ".join(ref))
    hyps.append(" ".join(hyp))
    ends = gold_ends(record, exp.units, len(ref)) or [None] * len(ref)
    pairs = correct_labels(ref, hyp)
    for i, frame in enumerate(at):
        total[frame % chunk] += 1
        wrong[frame % chunk] += i not in pairs
        end = ends[pairs[i]] if i in pairs else None
        if end is not None:
            lag[frame - int(end / step)] += 1


if __name__ == "__main__":
    main()
