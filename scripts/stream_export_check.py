"""Decode a split block by block over an exported streaming transducer's encoder step and compare
with the eager model's offline greedy search, utterance by utterance.

    cbasr-export --exp-dir exp/demo_hat_chunked_ctc --format onnx --out /tmp/chunked.onnx
    .venv/bin/python scripts/stream_export_check.py --exp-dir exp/demo_hat_chunked_ctc \\
        --export /tmp/chunked.onnx --features data/fbank/test

(run in a recipe's folder). Prints how many hypotheses are the same and the seconds each way
(one thread); exits 1 if any differs.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

from cbasr.data.features import FeatureStore
from cbasr.inference.experiment import Experiment
from cbasr.inference.transducer_export import TransducerRuntime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", type=Path, required=True, help="the exported experiment")
    parser.add_argument("--export", type=Path, required=True, help="cbasr-export's --out file")
    parser.add_argument("--features", type=Path, required=True, help="a split's feature folder")
    parser.add_argument("--limit", type=int, default=0, help="the first N utterances (0: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    exp = Experiment(args.exp_dir)
    runtime = TransducerRuntime(args.export)
    store = FeatureStore(args.features)
    utts = sorted(store.index)[: args.limit or None]
    same, streamed_s, eager_s = 0, 0.0, 0.0
    for utt in utts:
        feats = exp.normalise(store[utt])
        start = time.perf_counter()
        streamed = runtime.stream_greedy(feats)
        middle = time.perf_counter()
        with torch.no_grad():
            eager = exp.model.greedy_decode(feats[None], torch.tensor([feats.shape[0]]))[0]
        streamed_s += middle - start
        eager_s += time.perf_counter() - middle
        if streamed == eager:
            same += 1
        else:
            print(f"{utt}: streamed {streamed} != eager {eager}", file=sys.stderr)
    print(
        f"{same}/{len(utts)} hypotheses the same, streamed over {args.export.name}'s encoder "
        f"step ({streamed_s:.1f} s) and eager offline ({eager_s:.1f} s)"
    )
    return 0 if same == len(utts) else 1


if __name__ == "__main__":
    sys.exit(main())
