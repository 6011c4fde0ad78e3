"""Training throughput: input frames per second and the data pipeline's share of step time.

    .venv/bin/python scripts/bench_train.py                       # both presets, CPU (and CUDA if present)
    .venv/bin/python scripts/bench_train.py --presets blstm_ctc --device cpu --num-threads 1 --steps 20

    .venv/bin/python scripts/bench_train.py --presets blstm_ctc --set encoder.stack=4 encoder.stride=4
    .venv/bin/python scripts/bench_train.py --presets demo_hat --device cpu --steps 6 --profile 15
    .venv/bin/python scripts/bench_train.py --presets cb_monotonic,cb_monotonic_variable --device cpu \
        --num-threads 1 --synthetic --json     # one JSON object per line on stdout

Presets: every pinned experiment of the synthetic recipe (``recipes/synth/conf/NAME.yaml``;
``blstm_ctc`` is the demo's: 2x160 BLSTM over stacks of 3 frames, CTC), and
``conformer_ctc``, ``conf/encoder/conformer.yaml`` with the CTC loss. All train through the
real :class:`~cbasr.training.trainer.Trainer` (data loader, collation, step, optimizer) on
the prepared synth corpus (``recipes/synth/data``, 80-dim fbank, cached) when it exists, else
on random 80-dim features with the corpus's length distribution (``--synthetic``).

For each run it reports, over ``--steps`` steps after ``--warmup`` steps (with
``--warm-pass``, after one untimed pass over the measured batches too: on a GPU, Triton
compiles a kernel the first time it meets a block size, once per process and shape class,
which a short measurement would otherwise count as throughput):

- ``frames/s``: unpadded input frames (10 ms each) trained per second of wall time;
- ``wait``: the share of wall time the training loop waited for the next batch (what stalls
  the device; near 0 when worker processes keep up);
- ``load``: the time the data pipeline alone needs per batch (read, normalise, collate, in
  the main process), as a share of a step's time: its cost, hidden or not.
"""

import argparse
import collections
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from cbasr.config import CONF_DIR, to_typed
from cbasr.config.schema import register_configs
from cbasr.data.dataset import collate
from cbasr.data.features import FbankOptions
from cbasr.training.asr_task import asr_trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conformer_floor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes/synth"
PRESETS = {
    path.stem: (RECIPE / "conf", path.stem, []) for path in sorted((RECIPE / "conf").glob("*.yaml"))
}
PRESETS["conformer_ctc"] = (CONF_DIR, "train", ["encoder=conformer", "loss=ctc"])
# The LibriSpeech recipe's Conformers (18.6 M parameters, bf16, 60000 frames per batch) on the
# corpus's units: with --synthetic, random features of train-clean-100's lengths
for _name in ("conformer_ctc", "conformer_cb", "conformer_hat"):
    PRESETS[f"ls_{_name}"] = (
        ROOT / "recipes/librispeech/conf",
        _name,
        ["data.units=phones", "data.train_split=train", "data.valid_split=dev"],
    )


def _preset_list(text: str) -> list[str]:
    """``a,b`` (or one name) -> the preset names, each checked."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in PRESETS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown preset(s) {unknown}; choose from {sorted(PRESETS)}"
        )
    return names


# Random corpora's profiles: (utterances, units, frames per label, length draw in frames)
CORPORA = {
    # the synth corpus: mean 2.1 s, about 14 phones per second
    "synth": (2000, 45, 7, lambda rng, n: np.clip(rng.gamma(6.0, 35.0, n), 60, 800)),
    # train-clean-100: mean 12.7 s, at most 24.5 s, 500 sentencepiece pieces at about 3.3 per
    # second (one per 30 frames)
    "librispeech": (1000, 499, 30, lambda rng, n: np.clip(rng.gamma(9.0, 141.0, n), 100, 2450)),
}


def synthetic_corpus(
    root: Path, utts: int | None = None, dim: int = 80, seed: int = 0, profile: str = "synth"
) -> Path:
    """A prepared corpus of random features, lengths and label rate from ``CORPORA[profile]``
    (``utts`` training utterances, else the profile's)."""
    default_utts, units, frames_per_label, draw = CORPORA[profile]
    utts = utts or default_utts
    rng = np.random.default_rng(seed)
    phones = [f"p{i}" for i in range(units)]
    (root / "lang").mkdir(parents=True)
    (root / "lang/phones.txt").write_text("".join(f"{p}\n" for p in ["<blk>", *phones]))
    for split, count in (("train", utts), ("dev", 50)):
        out = root / "fbank" / split
        out.mkdir(parents=True)
        lengths = draw(rng, count).astype(int)
        feats = rng.standard_normal((int(lengths.sum()), dim)).astype(np.float16)
        feats.tofile(out / "feats.bin")
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        records = []
        with open(out / "index.tsv", "w") as index:
            for n, (offset, frames) in enumerate(zip(offsets, lengths)):
                utt = f"{split}-{n:05d}"
                index.write(f"{utt}\t{offset}\t{frames}\n")
                many = max(1, int(frames) // frames_per_label)
                labels = [phones[i] for i in rng.integers(0, len(phones), many)]
                records.append(
                    {
                        "id": utt,
                        "audio": f"{utt}.wav",
                        "duration": frames / 100,
                        "speaker": "s",
                        "words": " ".join(labels),
                        "phones": labels,
                    }
                )
        params = {"manifest": str(root / f"synth/{split}.jsonl"), **asdict(FbankOptions(dim))}
        (out / ".done").write_text(
            json.dumps({"params": params, "dim": dim, "frames": int(lengths.sum()), "kept": count})
        )
        (root / "synth").mkdir(exist_ok=True)
        (root / f"synth/{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "fbank/cmvn.json").write_text(
        json.dumps({"frames": 1, "mean": [0.0] * dim, "std": [1.0] * dim})
    )
    return root


def make_config(preset: str, data: Path, exp_dir: Path, args, device: str) -> dict:
    conf_dir, name, overrides = PRESETS[preset]
    with initialize_config_dir(str(conf_dir), version_base="1.3"):
        cfg = compose(
            name,
            overrides=[
                f"hydra.searchpath=[file://{CONF_DIR}]",
                *overrides,
                f"exp_dir={exp_dir}",
                f"data.manifest_dir={data / 'synth'}",
                f"data.feature_dir={data / 'fbank'}",
                f"data.vocab={data / 'lang/phones.txt'}",
                f"data.max_frames={args.max_frames}",
                f"data.num_workers={args.num_workers}",
                f"trainer.device={device}",
                f"trainer.num_threads={args.num_threads}",
                f"trainer.precision={args.precision}",
                "trainer.progress_bar=false",
                *args.overrides,
            ],
        )
    return to_typed(cfg)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profiler(device: torch.device) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes=True)


def sync_sites(trainer, batch_ids, tokens: int, preset: str) -> str:
    """Where one training step makes the host wait for the GPU: every synchronising CUDA
    operation (``torch.cuda.set_sync_debug_mode``: item, nonzero, copies to the host, and those
    inside operators, which the CPU counts of ``scripts/count_launches.py`` cannot see), by
    the toolkit's innermost frame and the operator's, with counts. Each one is a place a CUDA
    graph of the step cannot hold."""
    if trainer.device.type != "cuda":
        raise SystemExit("--sync-sites needs --device cuda: it asks CUDA which operations wait")
    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if f.name != "record"]
        ours = [f for f in frames if "/cbasr/" in f.filename or "/scripts/" in f.filename]
        where = " < ".join(
            f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-3:])
        )
        sites[f"{where} [{Path(filename).name}:{lineno}]"] += 1

    batch = next(iter(trainer.loader([batch_ids]))).to(trainer.device)
    _sync(trainer.device)
    shown = warnings.showwarning
    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            trainer.train_step(batch, tokens)
            _sync(trainer.device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = shown
    lines = [f"{preset}: {sum(sites.values())} synchronising operations in one step"]
    lines += [f"{n:4d}  {site}" for site, n in sites.most_common()]
    return "\n".join(lines)


def gpu_time_us(trainer, batches, tokens) -> float:
    """The device's kernel time, in microseconds, of training steps on ``batches`` (the
    profiler's CUDA activity only: the host's own time is not traced), replayed graphs'
    kernels included."""
    dev = trainer.device
    loaded = [b.to(dev) for b in trainer.loader(batches)]
    _sync(dev)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for batch, n in zip(loaded, tokens):
            trainer.train_step(batch, n)
        _sync(dev)
    return sum(e.self_device_time_total for e in prof.key_averages())


def bench(preset: str, data: Path, args, device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = asr_trainer(
            make_config(preset, data, Path(tmp) / "exp", args, device), Path(tmp) / "exp"
        )
        dev = trainer.device
        batches = trainer.task.sampler.batches()[: args.warmup + args.steps]
        if args.warm_pass:  # the measured batches once, untimed, then the run proper
            batches = batches[args.warmup :] + batches
            args = argparse.Namespace(**{**vars(args), "warmup": len(batches) - args.steps})
        frames = [sum(trainer.task.train_set.num_frames[i] for i in b) for b in batches]
        tokens = [sum(trainer.task.train_set.target_lens[i] for i in b) for b in batches]
        step_s, wait_s = [], []
        profiler = _profiler(dev) if args.profile else contextlib.nullcontext()
        waited = time.perf_counter()
        for k, batch in enumerate(trainer.loader(batches)):
            if k == args.warmup:
                profiler.__enter__()
            ready = time.perf_counter()
            batch = batch.to(dev, non_blocking=True)
            trainer.train_step(batch, tokens[k])
            _sync(dev)
            done = time.perf_counter()
            if k >= args.warmup:
                wait_s.append(ready - waited)
                step_s.append(done - ready)
            waited = time.perf_counter()
        profiler.__exit__(None, None, None)
        gpu = {}
        if args.gpu_time and dev.type == "cuda":  # the same batches again, kernels timed
            gpu_us = gpu_time_us(trainer, batches[args.warmup :], tokens[args.warmup :])
            gpu["gpu_ms"] = round(gpu_us / 1000 / len(step_s), 2)
            gpu["wall_ms"] = round(1000 * statistics.mean(step_s), 2)
        if args.sync_sites:
            try:
                print(sync_sites(trainer, batches[-1], tokens[-1], preset), file=sys.stderr)
            except RuntimeError as error:
                print(f"{preset}: --sync-sites failed: {error}", file=sys.stderr)
        if args.profile:
            sort = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
            table = profiler.key_averages().table(
                sort_by=sort, row_limit=args.profile, max_name_column_width=40
            )
            print(f"{preset} on {dev}, {len(step_s)} steps:\n{table}", file=sys.stderr)
        load_s = []  # the data pipeline alone, in this process
        for b in batches[args.warmup :]:
            start = time.perf_counter()
            collate([trainer.task.train_set[i] for i in b]).to(dev)
            _sync(dev)
            load_s.append(time.perf_counter() - start)
        floor = {}
        if args.floor:  # the same batches, on the device, through the minimal loop
            on_device = [b.to(dev) for b in trainer.loader(batches)]
            cfg, vocab = trainer.task.cfg, len(trainer.task.vocab)
            try:
                floor_s = conformer_floor.floor_run(
                    cfg, vocab, on_device, args.warmup, args.precision, dev
                )
            except RuntimeError as error:  # (out of memory, say) the toolkit's figures stand
                floor["floor_error"] = f"{type(error).__name__}: {error}"[:500]
    measured = sum(frames[args.warmup :])
    wall = sum(step_s) + sum(wait_s)
    if args.floor and "floor_error" not in floor:
        floor["floor_frames_per_s"] = round(measured / sum(floor_s))
        floor["floor_ratio"] = round(measured / wall / floor["floor_frames_per_s"], 3)
    return {
        "preset": preset,
        "device": str(dev),
        "cuda_graphs": trainer.options.cuda_graphs,
        "threads": torch.get_num_threads(),
        "workers": args.num_workers,
        "params_M": round(trainer.num_params / 1e6, 2),
        "steps": len(step_s),
        "utts_per_batch": round(statistics.mean(len(b) for b in batches[args.warmup :]), 1),
        "frames_per_s": round(measured / wall),
        "step_ms": round(1000 * statistics.median(step_s)),
        "wait_share": round(sum(wait_s) / wall, 3),
        "load_share": round(sum(load_s) / sum(step_s), 3),
        **gpu,
        **floor,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--presets",
        nargs="+",
        type=_preset_list,
        default=[["blstm_ctc", "conformer_ctc"]],
        help="preset names, space- or comma-separated (default: blstm_ctc conformer_ctc)",
    )
    parser.add_argument(
        "--device", default="all", help="cpu | cuda | all (cpu, and cuda when present)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--warm-pass",
        action="store_true",
        help="first train on the measured batches once, untimed (compiles every kernel variant "
        "they need; see above)",
    )
    parser.add_argument(
        "--max-frames", type=int, default=6000, help="data.max_frames (the recipe's default)"
    )
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--precision", default="fp32", help="trainer.precision (bf16/fp16 on CUDA)")
    parser.add_argument(
        "--synthetic", action="store_true", help="random features even if the corpus exists"
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="print one JSON object per row on stdout instead of the table, or with PATH also "
        "write the rows there as a JSON list",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile the measured steps (torch.profiler) and print the N operators with "
        "the most self time to stderr; the profiler's overhead counts in the "
        "figures, so take them from a run without it",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also train scripts/conformer_floor.py's minimal loop (torchaudio's Conformer, "
        "ctc_loss or rnnt_loss) of the preset's sizes on the same batches: its frames/s and "
        "the toolkit's share of them (for the Conformer presets)",
    )
    parser.add_argument(
        "--corpus",
        choices=sorted(CORPORA),
        default=None,
        help="the random corpus's lengths and units (--synthetic; default: librispeech for "
        "the ls_ presets, else synth)",
    )
    parser.add_argument(
        "--gpu-time",
        action="store_true",
        help="CUDA: also train the measured batches once more under the profiler (device "
        "activity only) and report the kernels' time per step (gpu_ms) beside the measured "
        "steps' mean wall time (wall_ms; equal when the device never waits on the host)",
    )
    parser.add_argument(
        "--sync-sites",
        action="store_true",
        help="CUDA: after the run, one more step with each operation that makes the host wait "
        "for the device listed to stderr by where it is called, with counts",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra overrides applied to every preset, e.g. --set encoder.stack=4 encoder.stride=4",
    )
    args = parser.parse_args(argv)
    args.presets = [name for names in args.presets for name in names]
    register_configs()
    random.seed(0)
    torch.manual_seed(0)
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    with tempfile.TemporaryDirectory() as tmp:
        corpora: dict[str, Path] = {}

        def data_for(preset: str) -> Path:  # the prepared synth corpus, or a random one
            real = RECIPE / "data"
            profile = args.corpus or ("librispeech" if preset.startswith("ls_") else "synth")
            if profile == "synth" and (real / "fbank/train/.done").is_file() and not args.synthetic:
                return real
            if profile not in corpora:
                corpora[profile] = synthetic_corpus(Path(tmp) / profile, profile=profile)
            return corpora[profile]

        print(
            f"data: recipes/synth/data (cached 80-dim fbank) where prepared, else random 80-dim "
            f"features; max_frames {args.max_frames}; precision {args.precision}",
            file=sys.stderr if args.json == "-" else sys.stdout,
        )
        rows = []
        for d in devices:
            for p in args.presets:
                try:
                    rows.append(bench(p, data_for(p), args, d))
                except RuntimeError as error:  # (a step that cannot be captured, say) the rest run
                    traceback.print_exc()
                    rows.append({"preset": p, "device": d, "error": str(error)[:500]})
                if args.json == "-":
                    print(json.dumps(rows[-1]), flush=True)
    if args.json == "-":
        return
    keys = list(dict.fromkeys(k for row in rows for k in row))
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row.get(k, "-")) for k in keys) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
