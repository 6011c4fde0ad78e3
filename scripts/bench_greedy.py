"""Transducer greedy decoding: label-looping against frame-looping, on one device and batch.

Random RNN-T and HAT models of the synthetic recipe's size (``bench_search.random_transducer``:
a 2x160 BLSTM, 49 phones + blank, the blank bias set so that they emit about one label per 8
input frames) decode batches of random utterances of 200-800 frames; the encoder runs once,
outside the timing. Each setting's time is the median of ``--repeats`` runs after a warm one,
the device synchronised around each; the hypotheses of the loops are compared. On CUDA also
label-looping replayed from CUDA graphs (``greedy_loop="graphs"``): its first call, which
captures the shape's graphs, timed apart.

With ``--beams``, the beam search too (the first batch size, one timed run after a warm one;
``--beams-only``: it alone, a line of its own either way),
its prefixes merged on the host, on the device and, on CUDA, on the device from CUDA graphs
(``transducer_beam_search``'s ``merge``), the hypotheses compared.

    .venv/bin/python scripts/bench_greedy.py                              # CPU
    python scripts/bench_greedy.py --device cuda --json --batches 16 64   # the GPU target: >= 3x
    .venv/bin/python scripts/bench_greedy.py --models hat --beams 4       # and the beam search
    .venv/bin/python scripts/bench_greedy.py --models rnnt tdt --beams 8   # TDT beside RNN-T

TDT (``--models tdt``: the same encoder, the TDT decoder with durations 0-4) has one greedy
search of its own (``tdt_greedy``) and one beam search (``tdt_beam_search``): their times
alone, on the same kind of batch.
    python scripts/bench_greedy.py --device cuda --json --beams 4 --beams-only
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_search  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_greedy(model, h, h_lens, loop: str, repeats: int, device: str):
    """``(median seconds, hypotheses)`` of ``model``'s greedy search by ``loop``."""
    model.greedy_loop = loop
    times, hyps = [], None
    with torch.no_grad():
        for i in range(repeats + 1):  # the first run warms up (allocator, kernels' first calls)
            _sync(device)
            start = time.perf_counter()
            hyps = model._greedy(h, h_lens)
            _sync(device)
            if i:
                times.append(time.perf_counter() - start)
    return statistics.median(times), hyps


def time_graphs(model, h, h_lens, args, frame_s: float, frame_hyps) -> dict:
    """The first call (which captures the shape's graphs) and the median replayed call of
    ``greedy_loop="graphs"``; ``identical`` compares its hypotheses with frame-looping's."""
    model.greedy_loop = "graphs"
    _sync(args.device)
    start = time.perf_counter()
    with torch.no_grad():
        model._greedy(h, h_lens)
    _sync(args.device)
    first_ms = 1000 * (time.perf_counter() - start)
    graphs_s, graphs_hyps = time_greedy(model, h, h_lens, "graphs", args.repeats, args.device)
    return {
        "graphs_first_call_ms": first_ms,
        "graphs_ms": 1000 * graphs_s,
        "graphs_speedup": frame_s / graphs_s,
        "graphs_identical": graphs_hyps == frame_hyps,
    }


def time_beams(model, h, h_lens, beams: list[int], device: str) -> dict:
    """Per beam width, the beam search's time with its prefixes merged on the host, on the
    device and (on CUDA) on the device from CUDA graphs (one timed run after a warm one, which
    captures the graphs) and whether their n-best lists are the same."""
    from cbasr.search import BeamSearchOptions, transducer_beam_search

    row = {}
    merges = ("host", "device", "graphs") if device.startswith("cuda") else ("host", "device")
    for beam in beams:
        options = BeamSearchOptions(beam=beam, max_symbols=model.max_symbols)
        found = {}
        for merge in merges:
            try:
                with torch.no_grad():
                    for _ in range(2):  # the first run warms up
                        _sync(device)
                        start = time.perf_counter()
                        found[merge] = transducer_beam_search(
                            model.decoder, h, h_lens, options, monotonic=model.monotonic,
                            merge=merge,
                        )  # fmt: skip
                        _sync(device)
            except RuntimeError as error:  # the other merges' figures stand; say why not these
                row[f"beam{beam}_{merge}_error"] = f"{type(error).__name__}: {error}"[:500]
                continue
            row[f"beam{beam}_{merge}_ms"] = 1000 * (time.perf_counter() - start)
        tokens = {m: [[x.tokens for x in n] for n in found[m]] for m in found}
        row[f"beam{beam}_identical"] = all(tokens[m] == tokens["host"] for m in tokens)
    return row


def _beam_line(row: dict, beams: list[int]) -> str:
    """A beam-search line of the table: each merge's time, and whether they agree."""
    times = [
        f"{merge} {row[f'beam{k}_{merge}_ms']:.1f} ms"
        for k in beams
        for merge in ("host", "device", "graphs")
        if f"beam{k}_{merge}_ms" in row
    ]
    same = all(row[f"beam{k}_identical"] for k in beams)
    return f"| {row['beam_search']} beam search, batch {row['batch']}: {', '.join(times)}" + (
        " |" if same else " (hypotheses differ) |"
    )


def tdt_row(model, h, h_lens, batch: int, args) -> None:
    """TDT's greedy search (the median of ``--repeats`` runs after a warm one) and, on the
    first batch size, its beam search of each ``--beams`` width (one run after a warm one)."""
    from cbasr.search import BeamSearchOptions
    from cbasr.search.tdt import tdt_beam_search

    # (its own keys: scripts/perf_table.py reads the "greedy" and "beam_search" lines as
    # label-looping's and the merges')
    row = {"tdt_search": "tdt", "batch": batch, "frames": int(h_lens.sum())}
    if not args.beams_only:
        seconds, hyps = time_greedy(model, h, h_lens, "label", args.repeats, args.device)
        row.update(labels=sum(map(len, hyps)), tdt_greedy_ms=1000 * seconds)
    if args.beams and batch == args.batches[0]:
        for beam in args.beams:
            options = BeamSearchOptions(beam=beam)
            with torch.no_grad():
                for _ in range(2):  # the first run warms up
                    _sync(args.device)
                    start = time.perf_counter()
                    tdt_beam_search(model.decoder, h, h_lens, options, model.max_symbols)
                    _sync(args.device)
            row[f"beam{beam}_ms"] = 1000 * (time.perf_counter() - start)
    if args.json:
        print(json.dumps(row), flush=True)
        return
    beams = ", ".join(
        f"beam {k} {row[f'beam{k}_ms']:.1f} ms" for k in args.beams if f"beam{k}_ms" in row
    )
    greedy = (
        f"greedy {row['tdt_greedy_ms']:.1f} ms, {row['labels']} labels" if "labels" in row else ""
    )
    print(
        f"| tdt | {batch} | {row['frames']} | {', '.join(x for x in (greedy, beams) if x)} |",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--models", nargs="+", default=["rnnt", "hat"], choices=["rnnt", "hat", "tdt"]
    )
    parser.add_argument("--batches", nargs="+", type=int, default=[16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    parser.add_argument(
        "--beams", nargs="*", type=int, default=[], help="beam widths: the beam search too"
    )
    parser.add_argument(
        "--beams-only", action="store_true", help="time the beam search alone (with --beams)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.json and not args.beams_only:
        print(
            "| model | batch | frames | labels | label-looping ms | frame-looping ms | speed-up |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        for batch in args.batches:
            model, h, h_lens = bench_search.random_transducer(name, batch, args.device)
            if name == "tdt":
                tdt_row(model, h, h_lens, batch, args)
                continue
            if args.beams and batch == args.batches[0]:
                beams = {"beam_search": name, "batch": batch, "frames": int(h_lens.sum())}
                beams.update(time_beams(model, h, h_lens, args.beams, args.device))
                print(json.dumps(beams) if args.json else _beam_line(beams, args.beams), flush=True)
                if not all(beams[f"beam{k}_identical"] for k in args.beams):
                    raise SystemExit(f"{name}, batch {batch}: the merges' hypotheses differ")
            if args.beams_only:
                continue
            label_s, label_hyps = time_greedy(model, h, h_lens, "label", args.repeats, args.device)
            frame_s, frame_hyps = time_greedy(model, h, h_lens, "frame", args.repeats, args.device)
            row = {
                "greedy": name,
                "batch": batch,
                "frames": int(h_lens.sum()),
                "labels": sum(map(len, label_hyps)),
                "label_looping_ms": 1000 * label_s,
                "frame_looping_ms": 1000 * frame_s,
                "speedup": frame_s / label_s,
                "identical": label_hyps == frame_hyps,
            }
            if args.device.startswith("cuda"):  # label-looping replayed from CUDA graphs
                try:
                    row.update(time_graphs(model, h, h_lens, args, frame_s, frame_hyps))
                except RuntimeError as error:  # the eager figures stand; say why not these
                    row["graphs_error"] = f"{type(error).__name__}: {error}"[:500]
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"| {name} | {batch} | {row['frames']} | {row['labels']} | "
                    f"{row['label_looping_ms']:.1f} | {row['frame_looping_ms']:.1f} | "
                    f"{row['speedup']:.2f}x{'' if row['identical'] else ' (hypotheses differ)'} |"
                    + (
                        f" graphs: {row['graphs_ms']:.1f} ms, {row['graphs_speedup']:.2f}x |"
                        if "graphs_ms" in row
                        else ""
                    ),
                    flush=True,
                )
            if not row["identical"] or not row.get("graphs_identical", True):
                raise SystemExit(f"{name}, batch {batch}: the two loops' hypotheses differ")


if __name__ == "__main__":
    main()
