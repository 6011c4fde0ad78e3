"""The performance tables of the docs from benchmark JSON lines (the targets of the kernels'
work, on a GPU and on the CPU).

    .venv/bin/python scripts/perf_table.py benchmarks/gpu benchmarks/cpu   # a table per folder
    .venv/bin/python scripts/perf_table.py --summary benchmarks/*/         # a row per folder
    .venv/bin/python scripts/perf_table.py --annotate FILE COMMIT COMMAND  # tag JSON lines

A folder holds what ``scripts/gpu_check.sh`` writes (or the same benchmarks run by hand, then
tagged with ``--annotate``): ``bench_losses.jsonl`` (``scripts/bench_losses.py --json``),
``bench_distributions.jsonl`` (``scripts/bench_distributions.py --json``, with an ``author``
row when the CB paper author's code was at hand) and ``bench_train.jsonl``
(``scripts/bench_train.py --synthetic --json``), each line tagged with the machine's name,
the commit and the command. A file that is missing leaves its rows out.

The ratios, each against its reference measured in the same run (the targets are a GPU's but
TDT's, which are the 2-core CPU's, one thread):

- ``cb_marginal_nll`` forward + backward time and peak extra memory over ``ctc_loss``'s, at
  each ``(B, T, U, V)`` (target: at most 1.0 on a GPU);
- ``hat_fused`` (:func:`cbasr.losses.hat_nll_from_logits`) time and memory over torchaudio's
  ``rnnt_loss`` (targets on a GPU: at most 1.0 and 0.6);
- the CB distribution's ``log_prob`` + backward and ID-checking sampling: the author's time
  over ours (target: at least 20 on a GPU);
- training frames per second of ``cb_pointwise`` and ``demo_hat`` over ``blstm_ctc``'s
  (targets on a GPU: at least 1.0 and 0.8), and of the second-order CB
  (``cb_monotonic_variable``) over the first-order ``cb_monotonic``'s (at least 0.5);
- transducer greedy decoding, label-looping's speed over frame-looping's on one batch, eager
  and replayed from CUDA graphs (``scripts/bench_greedy.py``'s lines in ``bench_train.jsonl``;
  target on a GPU: at least 3); with ``--beams``, the beam search's speed with its prefixes
  merged on the device, eager and from CUDA graphs, over merged on the host (at least 1: the
  condition for making one the default on a GPU, where the host is the default until
  measured);
- a training step's wall time over its kernels' time (``bench_train.py --gpu-time``), eager
  and replayed from CUDA graphs (``trainer.cuda_graphs``; target: at most 1.2 from graphs, the
  eager figure for comparison);
- the LibriSpeech Conformers' training frames per second over the minimal loop's of the same
  sizes on the same batches (``bench_train.py --floor``; target: at least 0.95);
- TDT decoding over RNN-T's on the same utterances (``bench_search.jsonl``:
  ``scripts/bench_search.py --exp-dir RNNT TDT --json``, trained models): the real-time factor
  of greedy search (target: at most 0.67, TDT 1.5 times as fast) and of each beam (at most 1),
  and of the search alone, the encoder's time taken out (same targets; the encoder is the same),
  from the newest run (one command's lines) on each set of utterances.
"""

import argparse
import json
import os
import platform
import sys
from pathlib import Path

GREEDY_SPEED_UP = 3.0  # label-looping over frame-looping greedy decoding, on a GPU
WALL_OVER_GPU = 1.2  # a training step's wall time over its kernels' time, from CUDA graphs
BEAM_MERGE = 1.0  # beam search, prefixes on the device over on the host: the GPU default's bar
FLOOR_RATIO = 0.95  # the LibriSpeech Conformers over scripts/conformer_floor.py's minimal loop
# (quantity, ours, reference, field, target, higher is better)
LOSS_RATIOS = [
    ("cb / ctc time", "cb", "ctc", "ms", 1.0, False),
    ("cb / ctc memory", "cb", "ctc", "peak_mb", 1.0, False),
    ("hat_fused / rnnt time", "hat_fused", "rnnt", "ms", 1.0, False),
    ("hat_fused / rnnt memory", "hat_fused", "rnnt", "peak_mb", 0.6, False),
]
DISTRIBUTION_RATIOS = [
    ("CB log_prob + backward: author / ours", "log_prob + backward", "cbasr"),
    ("CB ID-checking sample: author / ours", "sample", "cbasr id_checking"),
]
FILES = (
    "bench_losses.jsonl",
    "bench_distributions.jsonl",
    "bench_train.jsonl",
    "bench_search.jsonl",
)
TDT_GREEDY = 0.67  # TDT greedy RTF over RNN-T greedy's (the TDT paper's speed-up: 1.5x at least)
TDT_BEAM = 1.0  # TDT beam-search RTF over RNN-T's at the same beam
DISTRIBUTION_TARGET = 20.0
# (preset, reference preset, target): training frames per second
TRAIN_RATIOS = [
    ("cb_pointwise", "blstm_ctc", 1.0),
    ("demo_hat", "blstm_ctc", 0.8),
    ("cb_monotonic_variable", "cb_monotonic", 0.5),  # the second-order CB over the first
]


def read_lines(path: Path) -> list[dict]:
    """The JSON objects of ``path``, one per line; ``[]`` when it does not exist."""
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise SystemExit(f"{path}:{number}: not a JSON object: {error}") from None
    return rows


def _shape(row: dict) -> str:
    shape = row["shape"]
    return "(" + ", ".join(str(v) for v in shape.values()) + ")"


def ratios(folder: Path) -> list[dict]:
    """One dict per target quantity measured in ``folder``: ``quantity``, ``shape``, ``ours``,
    ``reference``, ``ratio``, ``target``, ``met`` (``None`` where a side is missing or 0)."""
    found = []

    def add(quantity, shape, ours, reference, target, higher, speed_up=False):
        """``ours / reference``, or ``reference / ours`` for a ``speed_up`` of times."""
        top, bottom = (reference, ours) if speed_up else (ours, reference)
        ratio = top / bottom if top is not None and bottom else None
        met = None if ratio is None else (ratio >= target if higher else ratio <= target)
        found.append(
            dict(quantity=quantity, shape=shape, ours=ours, reference=reference, ratio=ratio,
                 target=("≥ " if higher else "≤ ") + f"{target:g}", met=met)
        )  # fmt: skip

    losses = read_lines(folder / "bench_losses.jsonl")
    by_shape: dict[str, dict[str, dict]] = {}
    for row in losses:
        if "implementation" in row:
            rows = by_shape.setdefault(_shape(row), {})
            if row["implementation"] in rows:
                raise SystemExit(
                    f"{folder / 'bench_losses.jsonl'}: {row['implementation']} at "
                    f"{_shape(row)} is measured twice; keep one run per file"
                )
            rows[row["implementation"]] = row
    for quantity, ours, reference, field, target, higher in LOSS_RATIOS:
        for shape, rows in by_shape.items():
            if ours in rows or reference in rows:
                mine, theirs = rows.get(ours, {}).get(field), rows.get(reference, {}).get(field)
                add(quantity, shape, mine, theirs, target, higher)
    distributions = [r for r in read_lines(folder / "bench_distributions.jsonl") if "ms" in r]
    for quantity, operation, implementation in DISTRIBUTION_RATIOS:
        rows = {r["implementation"]: r for r in distributions if r.get("operation") == operation}
        if implementation in rows:
            shape = _shape(rows[implementation])
            author = rows.get("author", {}).get("ms")
            mine = rows[implementation]["ms"]
            add(quantity, shape, mine, author, DISTRIBUTION_TARGET, True, speed_up=True)
    lines = [r for r in read_lines(folder / "bench_train.jsonl") if "frames_per_s" in r]
    train = {r["preset"]: r for r in lines if not r.get("cuda_graphs")}
    for preset, reference, target in TRAIN_RATIOS:
        if preset in train or reference in train:
            mine = train.get(preset, {}).get("frames_per_s")
            theirs = train.get(reference, {}).get("frames_per_s")
            add(f"{preset} / {reference} frames/s", "", mine, theirs, target, True)
    for r in read_lines(folder / "bench_train.jsonl"):  # scripts/bench_greedy.py's lines
        if "greedy" in r:
            quantity = f"{r['greedy']} greedy: label-looping speed-up"
            mine, theirs = r["label_looping_ms"], r["frame_looping_ms"]
            add(quantity, f"batch {r['batch']}", mine, theirs, GREEDY_SPEED_UP, True, True)
            if "graphs_ms" in r:
                quantity = f"{r['greedy']} greedy: label-looping from CUDA graphs, speed-up"
                mine = r["graphs_ms"]
                add(quantity, f"batch {r['batch']}", mine, theirs, GREEDY_SPEED_UP, True, True)
        if "beam_search" in r:  # bench_greedy.py --beams
            for key in sorted(k for k in r if k.endswith("_host_ms")):
                beam = key.removeprefix("beam").removesuffix("_host_ms")
                for merge, how in (("device", "on the device"), ("graphs", "from CUDA graphs")):
                    quantity = f"{r['beam_search']} beam {beam}: prefixes {how}, speed-up"
                    mine = r.get(f"beam{beam}_{merge}_ms")
                    if mine is not None or f"beam{beam}_{merge}_error" in r:
                        add(quantity, f"batch {r['batch']}", mine, r[key], BEAM_MERGE, True, True)
    for r in lines:  # bench_train.py --gpu-time's lines: wall time over the kernels' time
        if "gpu_ms" in r:
            mode = "CUDA graphs" if r.get("cuda_graphs") else "eager"
            quantity = f"{r['preset']} step, {mode}: wall / GPU time"
            add(quantity, "", r["wall_ms"], r["gpu_ms"], WALL_OVER_GPU, False)
    for r in read_lines(folder / "bench_train.jsonl"):  # bench_train.py --floor's lines
        if "floor_frames_per_s" in r:
            quantity = f"{r['preset']} / minimal loop frames/s"
            mine, theirs = r["frames_per_s"], r["floor_frames_per_s"]
            add(quantity, "", mine, theirs, FLOOR_RATIO, True)
    searches = read_lines(folder / "bench_search.jsonl")
    # a run's lines share its command; of the runs on the same utterances the newest counts
    newest = {(r["manifest"], r["utts"]): r.get("command") for r in searches}
    searches = [r for r in searches if r.get("command") == newest[r["manifest"], r["utts"]]]
    for r in searches:  # TDT over RNN-T, the same utterances and beam (greedy: label-looping)
        if r.get("criterion") != "tdt":
            continue
        for ref in searches:
            same = ref.get("criterion") == "rnnt" and ref["beam"] == r["beam"]
            same = same and (ref["manifest"], ref["utts"]) == (r["manifest"], r["utts"])
            if not same or "frame-looping" in ref["search"]:
                continue
            search = "greedy" if r["beam"] == 0 else f"beam {r['beam']}"
            target = TDT_GREEDY if r["beam"] == 0 else TDT_BEAM
            shape = f"{r['utts']} utts of {Path(r['manifest']).name}"
            add(f"tdt / rnnt RTF, {search}", shape, r["rtf"], ref["rtf"], target, False)
            add(f"tdt / rnnt search time, {search}", shape, r["search_s"], ref["search_s"],
                target, False)  # fmt: skip
    return found


def machine(folder: Path) -> tuple[str, str]:
    """The machine's name (the first tagged line's) and the commits the folder's lines carry
    (short, in the order met, ``"?"`` for none)."""
    name, commits = None, []
    for file in FILES:
        for row in read_lines(folder / file):
            if "device_name" in row:
                name = name or row["device_name"]
                commit = str(row.get("commit", "?"))[:7]
                if commit not in commits:
                    commits.append(commit)
    return name or folder.name, ", ".join(commits) or "?"


def _number(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def table(folder: Path) -> str:
    name, commit = machine(folder)
    lines = [
        f"{name}, commit {commit} (`{folder}`)",
        "",
        "| quantity | shape | ours | reference | ratio | target | met |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in ratios(folder):
        met = {None: "-", True: "yes", False: "**no**"}[r["met"]]
        lines.append(
            f"| {r['quantity']} | {r['shape']} | {_number(r['ours'])} | "
            f"{_number(r['reference'])} | {_number(r['ratio'])} | {r['target']} | {met} |"
        )
    return "\n".join(lines)


def summary(folders: list[Path]) -> str:
    """One row per folder: each quantity's ratios over its shapes, separated by ``/``."""
    columns: list[str] = []
    rows = []
    for folder in folders:
        found: dict[str, list[str]] = {}
        for r in ratios(folder):
            found.setdefault(r["quantity"], []).append(_number(r["ratio"]))
            if r["quantity"] not in columns:
                columns.append(r["quantity"])
        rows.append((machine(folder), found))
    out = ["| machine | commit | " + " | ".join(columns) + " |"]
    out.append("|---|---|" + "---:|" * len(columns))
    for (name, commit), found in rows:
        cells = [" / ".join(found.get(c, ["-"])) for c in columns]
        out.append(f"| {name} | {commit} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def device_name() -> str:
    """The GPU's name where torch sees one, else the CPU's model and its cores."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


def annotate(path: Path, commit: str, command: str) -> None:
    """Tag each JSON line of ``path`` with ``device_name``, ``commit`` and ``command``."""
    name = device_name()
    rows = read_lines(path)
    for row in rows:
        row.update(device_name=name, commit=commit, command=command)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--summary", action="store_true", help="one row per folder")
    parser.add_argument(
        "--annotate", nargs=3, metavar=("FILE", "COMMIT", "COMMAND"), help="tag JSON lines"
    )
    args = parser.parse_args(argv)
    if args.annotate:
        path, commit, command = args.annotate
        annotate(Path(path), commit, command)
        return 0
    if not args.folders:
        parser.error("name at least one folder of benchmark JSON lines")
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder}: not a folder")
    if args.summary:
        print(summary(args.folders))
    else:
        print("\n\n".join(table(folder) for folder in args.folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
