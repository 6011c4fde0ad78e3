"""Peak memory of cbasr-train-lm's data path on a large generated LM text.

    .venv/bin/python scripts/bench_lm_text.py                          # 50M words, both paths
    .venv/bin/python scripts/bench_lm_text.py --words 5000000 --json   # one JSON line per phase

Writes a text of ``--words`` words (``--vocab-size`` word types, 5-35 words a line) and measures,
each in a fresh process (``ru_maxrss``, less that of a process that only imports cbasr and
torch):

- ``sharded``: what the LM task does: tokenise the text into shards
  (:func:`cbasr.lm.shards.build_shards`), count each shard's batches, then run one whole
  epoch of the task's loader (every batch padded into tensors, as training reads them);
- ``sharded_reused``: the same with the shards already built (a resumed or second run);
- ``whole``: the text read whole into memory (:func:`cbasr.lm.corpus.read_sentences`, how
  cbasr-train-lm read it before the shards), for comparison (``--no-whole`` skips it).
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PHASES = ("baseline", "sharded", "sharded_reused", "whole")


def write_text(path: Path, words: int, vocab_size: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    types = np.array([f"w{i}" for i in range(vocab_size)])
    written = 0
    with open(path, "w") as f:
        while written < words:
            lengths = rng.integers(5, 36, size=10_000)
            ids = rng.integers(0, vocab_size, size=int(lengths.sum()))
            tokens = types[ids]
            lines, start = [], 0
            for n in lengths:
                lines.append(" ".join(tokens[start : start + n]))
                start += n
            f.write("\n".join(lines) + "\n")
            written += int(lengths.sum())
    return written


def run_phase(phase: str, text: Path, vocab: Path, work: Path, shard_tokens: int) -> dict:
    """In this (child) process: one phase; returns its figures."""
    import torch  # noqa: F401  (the baseline imports what the task imports)

    from cbasr.data.vocab import Vocabulary
    from cbasr.lm.corpus import read_sentences
    from cbasr.lm.neural import pad_sentences
    from cbasr.lm.shards import EpochPlan, build_shards, sentences_of

    start = time.perf_counter()
    out = {"phase": phase}
    if phase in ("sharded", "sharded_reused"):
        shards = build_shards(text, Vocabulary.load(vocab), "words", work / "shards", shard_tokens)
        built = time.perf_counter()
        counts = shards.batch_counts(4000)
        plan = EpochPlan(shards, 4000, seed=1001, counts=counts)
        batches = tokens = 0
        for batch, sentences in zip(plan, sentences_of(shards, plan)):
            targets, lens = pad_sentences(sentences, "cpu")
            batches += 1
            tokens += batch.tokens
        out.update(
            shards=len(shards.shards),
            sentences=len(shards),
            batches=batches,
            predicted_tokens=tokens,
            build_s=round(built - start, 1),
            epoch_s=round(time.perf_counter() - built, 1),
        )
    elif phase == "whole":
        sentences, _ = read_sentences(text, Vocabulary.load(vocab), "words")
        out.update(sentences=len(sentences), read_s=round(time.perf_counter() - start, 1))
    out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", type=int, default=50_000_000)
    parser.add_argument("--vocab-size", type=int, default=1000)
    parser.add_argument("--shard-tokens", type=int, default=10_000_000)
    parser.add_argument("--dir", type=Path, help="work folder (default: a temporary one)")
    parser.add_argument("--no-whole", action="store_true", help="skip the whole-text phase")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.dir or Path(tmp)
        text, vocab = work / "lm.txt", work / "vocab.txt"
        if args.phase:  # a child
            print(json.dumps(run_phase(args.phase, text, vocab, work, args.shard_tokens)))
            return
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        words = write_text(text, args.words, args.vocab_size)
        vocab.write_text("<blk>\n" + "".join(f"w{i}\n" for i in range(args.vocab_size)))
        size_mb = text.stat().st_size / 2**20
        print(
            f"# {words} words, {size_mb:.0f} MB of text in {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
        results = []
        for phase in PHASES:
            if phase == "whole" and args.no_whole:
                continue
            cmd = [sys.executable, __file__, "--phase", phase, "--dir", str(work)]
            cmd += ["--shard-tokens", str(args.shard_tokens)]
            child = subprocess.run(cmd, capture_output=True, text=True, check=True)
            result = json.loads(child.stdout.strip().splitlines()[-1])
            result.update(words=words, text_mb=round(size_mb, 1), shard_tokens=args.shard_tokens)
            results.append(result)
        baseline = results[0]["max_rss_mb"]
        for result in results:
            result["growth_mb"] = round(result["max_rss_mb"] - baseline, 1)
            if args.json:
                print(json.dumps(result))
            else:
                extras = {k: v for k, v in result.items() if k not in ("phase", "growth_mb")}
                print(f"{result['phase']:>15}: {result['growth_mb']:8.1f} MB growth  {extras}")


if __name__ == "__main__":
    main()
