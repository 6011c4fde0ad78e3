#!/usr/bin/env python
"""Does a transducer's label history suppress a word that repeats its predecessor?

For every reference word that repeats the one before it (the second ``four`` of ``four four``)
in a split with gold word times (the digits corpus), this probe takes the best frame near that
word (its gold span, 3 encoder frames either side) of ``log P(emit y_l)`` at label position
``l`` of the teacher-forced lattice, once with the true history and once with the previous
word swapped for each other label (averaged), and prints how much the true history lowers it.
A joint that reads "the last label is the word I hear, so blank" shows as true-history values
well below the swapped ones at the repeats it deletes.

    python scripts/probe_repeats.py --exp-dir exp/hat --manifest-dir data/digits \\
        --feature-dir data/fbank --split test

RNN-T: ``log_softmax`` of the joint's unit ``y``; HAT: ``log(1 - b) + log P(y)``; TDT: the
token distribution's ``log P_T(y)`` (whatever the duration).
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from cbasr.data.features import FeatureStore
from cbasr.inference.experiment import Experiment, frame_shift_seconds, subsampling_stride


def _best_emission(model, h, lens, ids: list[int], position: int, frames: slice) -> float:
    """max over ``frames`` of ``log P(emit ids[position])`` at label position ``position``."""
    out = model.decoder(h, lens, torch.tensor([ids]))
    if model.criterion == "tdt":  # token and duration log probabilities: the token's
        emit = out[0][0, :, position, ids[position]]
    elif model.criterion == "hat":  # blank logits, label log probabilities
        blank, labels = out
        emit = F.logsigmoid(-blank[0, :, position]) + labels[0, :, position, ids[position] - 1]
    else:  # RNN-T: one softmax, blank is unit 0
        emit = out.log_softmax(-1)[0, :, position, ids[position]]
    return float(emit[frames].max())


def probe(exp_dir: str, manifest_dir: str, feature_dir: str, split: str) -> list[dict]:
    exp = Experiment(exp_dir)
    store = FeatureStore(Path(feature_dir) / split)
    seconds = frame_shift_seconds(feature_dir) * subsampling_stride(exp.model)
    rows = []
    for line in (Path(manifest_dir) / f"{split}.jsonl").read_text().splitlines():
        record = json.loads(line)
        words = record["words"].split()
        repeats = [i for i in range(1, len(words)) if words[i] == words[i - 1]]
        if not repeats or record["id"] not in store:
            continue
        offset, n = store.index[record["id"]]
        feats = exp.normalise(torch.from_numpy(store._data[offset : offset + n].astype("float32")))
        ids = exp.vocab.encode(words)
        with torch.no_grad():
            h, lens = exp.model.encoder(feats[None], torch.tensor([n]))
            for i in repeats:
                start = max(int(record["word_starts"][i] / seconds) - 3, 0)
                frames = slice(start, int(record["word_ends"][i] / seconds) + 4)
                true = _best_emission(exp.model, h, lens, ids, i, frames)
                swapped = []
                for other in range(1, len(exp.vocab)):
                    if other != ids[i]:
                        changed = ids[: i - 1] + [other] + ids[i:]
                        swapped.append(_best_emission(exp.model, h, lens, changed, i, frames))
                gap = record["word_starts"][i] - record["word_ends"][i - 1]
                rows.append(
                    {"id": record["id"], "word": i, "gap_ms": round(1000 * gap), "true": true,
                     "swapped": statistics.mean(swapped)}
                )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", required=True, nargs="+")
    parser.add_argument("--manifest-dir", required=True)
    parser.add_argument("--feature-dir", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--show", type=int, default=5, help="the lowest true-history repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for exp_dir in args.exp_dir:
        rows = probe(exp_dir, args.manifest_dir, args.feature_dir, args.split)
        drops = [r["true"] - r["swapped"] for r in rows]
        print(
            f"{exp_dir}: {len(rows)} repeats; true minus swapped history, median "
            f"{statistics.median(drops):+.2f}, {sum(d < -1 for d in drops)} below -1 nat"
        )
        for r in sorted(rows, key=lambda r: r["true"])[: args.show]:
            print(
                f"  {r['id']} word {r['word']} (gap {r['gap_ms']} ms): true {r['true']:.2f}, "
                f"swapped {r['swapped']:.2f}"
            )


if __name__ == "__main__":
    main()
