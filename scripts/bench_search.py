"""Decoding speed of the searches: CPU real-time factor for greedy search and beam 1, 4, 16.

Random-weight models of the synthetic recipe's size (``conf/`` presets with the recipe's
2x160 BLSTM over stacks of 3 frames, 49 phones + blank) decode dev utterances of the prepared
corpus (``recipes/synth/data``: 80-dim filterbanks). Nothing is trained: speed does not depend
on the weights, except through how often a model emits, so each model's emission (CB) or blank
(transducer) bias is first shifted until its greedy search emits about as many labels as the
references have (printed as "labels / ref"): a random CB model would otherwise emit on half of
the frames and a random transducer up to ``max_symbols`` labels on every frame.

RTF = decoding wall time (encoder included) / audio duration; "search s" is the decoding time
less the encoder's (timed alone on the same batches). On a CPU shared with other jobs,
the many small operations of a search slow down badly with two OpenMP threads (each waits for
the other): ``--threads 1`` (the default) is the fair setting there; the load average is printed.

    .venv/bin/python scripts/bench_search.py                      # 60 dev utterances, all models
    .venv/bin/python scripts/bench_search.py --utts 20 --models ctc cb_pointwise --beams 1 4
    .venv/bin/python scripts/bench_search.py --exp-dir recipes/synth/exp/blstm_ctc   # a trained model
    .venv/bin/python scripts/bench_search.py --models cb_autoregressive --cb-search label
    .venv/bin/python scripts/bench_search.py --data recipes/digits/data --manifest digits/test.jsonl \
        --exp-dir recipes/digits/exp/hat --beams 4          # a digits model on its test set

Transducers' greedy search is timed twice, label-looping (the models' default) and
frame-looping (``cbasr.models.transducer_greedy``); their hypotheses are checked equal (TDT has
one greedy search, its own).

Several ``--exp-dir`` are timed one after the other on the same batches; ``--json FILE``
appends one JSON line per (model, search) to ``FILE`` (``scripts/perf_table.py`` reads
``bench_search.jsonl`` for TDT's speed over RNN-T's):

    .venv/bin/python scripts/bench_search.py --data recipes/digits/data --manifest digits/test.jsonl \
        --exp-dir recipes/digits/exp/rnnt recipes/digits/exp/tdt --beams 8 --utts 300 \
        --json benchmarks/cpu/bench_search.jsonl

``--rounds N`` times everything N times, the models in turn and their order reversed each round,
and reports the medians: on a machine that other jobs share, the models then meet the same load.

Without a prepared corpus, ``--random N`` decodes ``N`` utterances of random features (200-800
frames, 49 phones + blank, about one reference label per 8 frames, the corpus's phone rate):

    .venv/bin/python scripts/bench_search.py --random 60 --models rnnt tdt --beams 8
"""

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cbasr import builder  # noqa: E402
from cbasr.cli.models import compose_model_config  # noqa: E402
from cbasr.data.batching import BucketBatchSampler  # noqa: E402
from cbasr.data.features import FeatureStore, load_cmvn  # noqa: E402
from cbasr.data.manifest import read_manifest  # noqa: E402
from cbasr.data.vocab import Vocabulary  # noqa: E402
from cbasr.models import CBModel  # noqa: E402
from cbasr.search import BeamSearchOptions, beam_search, cb_search_kind  # noqa: E402

MODELS = {  # name -> Hydra overrides (on top of the recipe's encoder)
    "ctc": ["decoder=pointwise", "loss=ctc"],
    "cb_pointwise": ["decoder=pointwise", "loss=cb_marginal"],
    "cb_attention_emission": ["decoder=attention_emission", "loss=cb_marginal"],
    "cb_autoregressive": ["decoder=autoregressive", "loss=cb_reinforce"],
    "cb_autoregressive_luo": ["decoder=autoregressive_luo", "loss=forced_suffix"],
    "rnnt": ["decoder=transducer", "loss=rnnt"],
    "hat": ["decoder=hat", "loss=hat"],
    "tdt": ["decoder=tdt", "loss=tdt"],  # the token-and-duration transducer, durations 0-4
}
ENCODER = ["encoder=blstm", "encoder.hidden=160", "encoder.num_layers=2"]


def _bias(model) -> torch.Tensor | None:
    """The bias whose shift sets how often ``model`` emits (None for CTC), and its sign."""
    d = model.decoder
    if isinstance(model, CBModel):
        return d.emission_bias(), 1.0
    joint = getattr(d, "joint", None)
    if getattr(joint, "linear_blank", False):
        return joint.blank_encoder.bias, -1.0
    if joint is not None:  # unit 0: the blank (RNN-T) or the blank logit (HAT)
        return joint.out[-1].bias[:1], -1.0
    return None, 0.0


@torch.no_grad()
def calibrate(model, feats, lens, ref_labels: int) -> float:
    """Shift the emission/blank bias (bisection) until greedy search emits about ``ref_labels``."""
    bias, sign = _bias(model)
    if bias is None:
        return 0.0
    base = bias.clone()
    low, high = -12.0, 12.0
    for _ in range(14):
        mid = (low + high) / 2
        bias.copy_(base + sign * mid)
        emitted = sum(len(y) for y in model.greedy_decode(feats, lens))
        low, high = (mid, high) if emitted < ref_labels else (low, mid)
    bias.copy_(base + sign * (low + high) / 2)
    return (low + high) / 2


@torch.no_grad()
def random_transducer(name: str, batch: int, device: str = "cpu", seed: int = 0):
    """``(model, h, h_lens)``: a random ``name`` model (``rnnt``, ``hat``) of the synth
    recipe's size in eval mode on ``device``, and its encoder's output for ``batch`` random
    utterances of 200-800 frames, the blank bias moved (bisection) until the greedy search
    emits about one label per 8 input frames (the synthetic corpus's phone rate)."""
    torch.manual_seed(seed)
    cfg = compose_model_config(ENCODER + MODELS[name])
    model = builder.build_model(*cfg.values(), 80, 50).eval().to(device)
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(200, 801, (batch,), generator=g)
    feats = torch.randn(batch, int(lens.max()), 80, generator=g)
    h, h_lens = model.encoder(feats.to(device), lens.to(device))
    bias, sign = _bias(model)
    base, low, high = bias.clone(), -12.0, 12.0
    for _ in range(12):
        middle = (low + high) / 2
        bias.copy_(base + sign * middle)
        emitted = sum(map(len, model._greedy(h, h_lens)))
        low, high = (middle, high) if emitted < int(lens.sum()) // 8 else (low, middle)
    return model, h, h_lens


def random_features(count: int, seed: int = 0) -> list[torch.Tensor]:
    """``count`` utterances of normalised random 80-dim features, 200-800 frames each."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(200, 801, (count,), generator=g).tolist()
    return [torch.randn(n, 80, generator=g) for n in lens]


def _models(args, vocab, padded: list, ref_labels: int, frames: int):
    """``(name, model)`` pairs: the trained experiment's, or random calibrated ones."""
    if args.exp_dir:
        from cbasr.inference.experiment import Experiment

        for exp_dir in args.exp_dir:
            yield exp_dir.name, Experiment(exp_dir).model
        return
    for name in args.models:
        cfg = compose_model_config(ENCODER + MODELS[name])
        torch.manual_seed(0)
        model = builder.build_model(*cfg.values(), 80, len(vocab)).eval()
        calib = padded[0] if len(padded[0][1]) >= 4 else padded[-1]
        calibrate(model, *calib, round(ref_labels * int(calib[1].sum()) / frames))
        yield name, model


def _settings(model, args) -> list[tuple[str, int, BeamSearchOptions]]:
    """``(search, beam, options)`` of each search timed (beam 0: greedy); a transducer's greedy
    search twice, label-looping and frame-looping (TDT has one greedy search, its own)."""
    transducer = type(model).__name__ == "TransducerModel" and model.criterion != "tdt"
    greedy = ["greedy (label-looping)", "greedy (frame-looping)"] if transducer else ["greedy"]
    cb_search = args.cb_search if type(model).__name__ == "CBModel" else "auto"
    return [(search, 0, BeamSearchOptions(beam=1)) for search in greedy] + [
        (f"beam {beam}", beam, BeamSearchOptions(beam=beam, cb_search=cb_search))
        for beam in args.beams
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT / "recipes/synth/data")
    parser.add_argument(
        "--manifest", default="synth/dev.jsonl", help="under --data; features in fbank/<its stem>"
    )
    parser.add_argument("--utts", type=int, default=60, help="utterances decoded per setting")
    parser.add_argument(
        "--random",
        type=int,
        default=0,
        metavar="N",
        help="decode N utterances of random features instead of --data (random models only)",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument(
        "--cb-search",
        choices=["auto", "frame", "label"],
        default="auto",
        help="CB models: which beam search (auto: frame-synchronous)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every model and search this many times, the models in turn (their order "
        "reversed each round), and report the medians: fairer on a shared machine",
    )
    parser.add_argument("--max-frames", type=int, default=20000, help="input frames per batch")
    parser.add_argument(
        "--exp-dir",
        type=Path,
        nargs="+",
        default=[],
        help="benchmark these trained experiments' best checkpoints instead of random models",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="append a JSON line per model and search here"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    torch.set_num_threads(args.threads)
    if args.random:
        if args.exp_dir:
            parser.error("--random decodes with random models: no --exp-dir")
        vocab, feats, manifest = list(range(50)), random_features(args.random), "random features"
        ref_labels = sum(f.shape[0] for f in feats) // 8
    else:
        vocab = None if args.exp_dir else Vocabulary.load(args.data / "lang/phones.txt")
        mean, std = load_cmvn(args.data / "fbank/cmvn.json")
        manifest = args.data / args.manifest
        store = FeatureStore(args.data / "fbank" / Path(args.manifest).stem)
        records = [r for r in read_manifest(manifest) if r["id"] in store][: args.utts]
        feats = [(store[r["id"]] - mean) / std for r in records]
        ref_labels = sum(len(r["phones"] if "phones" in r else r["words"].split()) for r in records)
    audio = sum(f.shape[0] for f in feats) * 0.01
    batches = BucketBatchSampler(
        [f.shape[0] for f in feats], args.max_frames, shuffle=False
    ).batches()
    padded = [
        (
            torch.nn.utils.rnn.pad_sequence([feats[i] for i in b], batch_first=True),
            torch.tensor([feats[i].shape[0] for i in b]),
        )
        for b in batches
    ]
    load_before = os.getloadavg()[0]
    print(
        f"{len(feats)} utterances of {manifest}, {audio:.1f} s of audio, {ref_labels} reference labels; "
        f"{args.threads} thread(s); load average before: {load_before:.2f}"
    )
    print(
        "\n| model | parameters | search | decode s | search s | RTF | labels / ref |\n"
        "|---|---:|---|---:|---:|---:|---:|"
    )
    models = list(_models(args, vocab, padded, ref_labels, sum(f.shape[0] for f in feats)))
    seconds, encoder, emitted, hypotheses = defaultdict(list), defaultdict(list), {}, {}
    for round_ in range(args.rounds):  # the models in turn, the order reversed each round
        for name, model in models if round_ % 2 == 0 else models[::-1]:
            start = time.perf_counter()
            with torch.no_grad():
                for x, lens in padded:
                    model.encoder(x, lens)
            encoder[name].append(time.perf_counter() - start)
            for search, beam, options in _settings(model, args):
                if beam == 0 and "looping" in search:
                    model.greedy_loop = search.split("(")[1].split("-")[0]
                start, hyps = time.perf_counter(), []
                with torch.no_grad():
                    for x, lens in padded:
                        if beam == 0:
                            hyps += model.greedy_decode(x, lens)
                        else:
                            hyps += [n[0].tokens for n in beam_search(model, x, lens, options)]
                seconds[name, search].append(time.perf_counter() - start)
                emitted[name, search] = sum(map(len, hyps))
                if beam == 0:
                    hypotheses.setdefault(name, {})[search] = hyps
    for name, model in models:
        params = sum(p.numel() for p in model.parameters())
        encoder_s = statistics.median(encoder[name])
        for search, beam, options in _settings(model, args):
            decode_s = statistics.median(seconds[name, search])
            rate = emitted[name, search] / ref_labels
            if beam and type(model).__name__ == "CBModel":
                search += f" ({cb_search_kind(model, options)})"
            if args.json is not None:
                row = dict(
                    search_bench=name, criterion=getattr(model, "criterion", None),
                    search=search, beam=beam, decode_s=round(decode_s, 4),
                    search_s=round(decode_s - encoder_s, 4), encoder_s=round(encoder_s, 4),
                    rtf=round(decode_s / audio, 6), labels_per_ref=round(rate, 4),
                    utts=len(feats), audio_s=round(audio, 2), manifest=str(manifest),
                    threads=args.threads, rounds=args.rounds, load_before=round(load_before, 2),
                )  # fmt: skip
                with args.json.open("a") as out:
                    out.write(json.dumps(row) + "\n")
            print(
                f"| {name} | {params / 1e6:.2f} M | {search} | {decode_s:.2f} | "
                f"{decode_s - encoder_s:.2f} | {decode_s / audio:.4f} | {rate:.2f} |",
                flush=True,
            )
        greedy = hypotheses.get(name, {})
        if len(greedy) == 2 and len(set(map(str, greedy.values()))) != 1:
            raise SystemExit(f"{name}: label-looping and frame-looping greedy searches differ")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
