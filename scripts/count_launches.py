"""Kernel launches and device reads of the CUDA path, counted on the CPU (no GPU needed).

    TRITON_INTERPRET=1 .venv/bin/python scripts/count_launches.py --losses ctc,cb,rnnt,hat_fused,hat_pruned
    TRITON_INTERPRET=1 .venv/bin/python scripts/count_launches.py --presets blstm_ctc,cb_pointwise,demo_hat
    .venv/bin/python scripts/count_launches.py --presets ls_conformer_ctc --max-frames 3000 --precision bf16 --floor
    .venv/bin/python scripts/count_launches.py --greedy rnnt,hat,recipes/digits/exp/hat --beams 4

On a GPU a small batch costs what the host spends queueing kernels (a fixed cost each in eager
PyTorch, whatever the kernel's size: docs/performance.md, "Where the time goes on a GPU") and
what every read of a device value costs: the host waits for the device's queue to drain, and
the device then waits for the host to queue more. Neither count depends on the GPU, so this
script takes them on the CPU, with the recursions on the Triton backend (in Triton's
interpreter, set by this script) as on CUDA:

- ``kernels``: the PyTorch operators called that launch a kernel on CUDA (views, shape and
  metadata operators, and ``empty``, launch none);
- ``triton``: launches of the toolkit's Triton kernels;
- ``reads``: copies of tensor values to the host (``.item()``, ``int()``, ``bool()``,
  ``.tolist()``, ``.numpy()``, ``nonzero`` and the other operators whose output size depends on
  the values), each a wait for the device on CUDA.

``--losses``: one forward and backward of a loss of ``scripts/bench_losses.py`` at ``--sizes``
(tiny by default: the counts do not depend on the sizes). ``--distributions``: the CB
distribution's ``log_prob`` with its backward and its samplers' ``sample`` (B = 4, T = 20,
k = 5), with argument checks, as ``scripts/bench_distributions.py`` times them. ``--presets``:
one training step of a preset of ``scripts/bench_train.py`` on random features
(``--synthetic``), the optimizer's update left out (on CUDA it is a handful of ``foreach``
kernels for all the parameters, on the CPU a loop over them). With ``--floor``, beside it the forward and
backward of ``scripts/conformer_floor.py``'s minimal loop of the preset's sizes on the same batch
(a Conformer preset's), under the same ``--precision``. ``--greedy``: a transducer's
greedy search over a batch of 16 utterances, label-looping and frame-looping
(:mod:`cbasr.models.transducer_greedy`), the encoder left out: a random model of the synth
recipe's size on random features, or a trained experiment (a directory) on its recipe's test
utterances; with ``--beams``, its beam search too (the prediction network stepped under a mask,
as on CUDA), with its prefixes merged on the host and on the device (``merge``). One JSON object per line with
``--json``.

What the CPU cannot show: a copy of a CPU tensor to the device (also a wait, for memory that
is not pinned), since every tensor here is on the CPU already; and where code chooses by the
device, the CPU's choice is counted. The losses and distributions choose by the backend
(Triton here, as on CUDA); in a training step two model parts choose by the device: the
dropout masks (6 kernels each here, ``F.dropout``'s one on CUDA) and the recurrent encoders
(one layer and direction at a time on the padded batch here, with their reversals; one
packed cuDNN call for the stack on CUDA, with its packing), so the steps' counts are the
CPU's for those parts. The second-order monotonic decoder's band is counted in CUDA's block size
(``MonotonicAttentionDecoder.band_elements``).
"""

import argparse
import collections
import contextlib
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Operators that launch no kernel on CUDA: views, shape and metadata queries, allocation.
NO_KERNEL = {
    "alias",
    "as_strided",
    "chunk",
    "detach",
    "empty",
    "empty_like",
    "empty_strided",
    "expand",
    "is_same_size",
    "lift_fresh",
    "new_empty",
    "new_empty_strided",
    "permute",
    "promote_types",
    "reshape",
    "_reshape_alias",
    "scalar_tensor",
    "select",
    "size",
    "slice",
    "split",
    "squeeze",
    "t",
    "transpose",
    "unbind",
    "unsqueeze",
    "_unsafe_view",
    "view",
}
# Operators that copy values to the host (their result or its size depends on the values).
READS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
}


class Counter(TorchDispatchMode):
    """Counts kernels, reads and Triton launches while active (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.kernels = 0
        self.reads = 0
        self.triton = collections.Counter()
        self.by_operator = collections.Counter()
        self._paused = 0
        self._undo = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._paused:
            name = func.overloadpacket.__name__
            if name in READS:
                self.reads += 1
            elif name not in NO_KERNEL:
                self.kernels += 1
                self.by_operator[name] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def paused(self):
        """Nothing inside is counted (a Triton launch's interpreter, the optimizer)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _patch(self, owner, attr, make):
        original = getattr(owner, attr)
        setattr(owner, attr, make(original))
        self._undo.append((owner, attr, original))

    def __enter__(self):
        def read(original):  # reads that do not dispatch an operator on the CPU
            def counted(tensor, *args, **kwargs):
                if not self._paused:
                    self.reads += 1
                return original(tensor, *args, **kwargs)

            return counted

        def launch(original):
            def counted(kernel, *args, **kwargs):
                self.triton[kernel.fn.__name__] += 1
                with self.paused():
                    return original(kernel, *args, **kwargs)

            return counted

        from triton.runtime.interpreter import InterpretedFunction

        self._patch(torch.Tensor, "tolist", read)
        self._patch(torch.Tensor, "numpy", read)
        self._patch(InterpretedFunction, "run", launch)
        return super().__enter__()

    def __exit__(self, *exc):
        while self._undo:
            owner, attr, original = self._undo.pop()
            setattr(owner, attr, original)
        return super().__exit__(*exc)

    def result(self) -> dict:
        return {
            "kernels": self.kernels,
            "triton": sum(self.triton.values()),
            "reads": self.reads,
            "triton_kernels": dict(self.triton),
        }


def count(fn) -> dict:
    """The counts of calling ``fn()`` on the Triton backend."""
    from cbasr._backends import use_backend

    with use_backend("triton"), Counter() as counter:
        fn()
    return counter.result()


def count_loss(loss: str, sizes: tuple[int, int, int, int]) -> dict:
    """One forward and backward of ``loss`` (a name of ``bench_losses.py``)."""
    import bench_losses

    B, T, U, V = sizes
    leaves, run = bench_losses._make_inputs(loss, B, T, U, V, "cpu")
    result = count(lambda: run().sum().backward())
    return {"loss": loss, "sizes": list(sizes), **result}


def count_distribution(operation: str) -> dict:
    """``log_prob`` + backward, or ``sample`` by one sampler, of ``ConditionalBernoulli``."""
    from cbasr.distributions import ConditionalBernoulli

    g = torch.Generator().manual_seed(0)
    B, T, k = 4, 20, 5
    logits, total = torch.randn(B, T, generator=g), torch.full((B,), k)
    if operation == "log_prob":
        highs = torch.zeros(B, T)
        highs[:, :k] = 1
        logits.requires_grad_()
        result = count(lambda: ConditionalBernoulli(logits, total).log_prob(highs).sum().backward())
    else:
        result = count(lambda: ConditionalBernoulli(logits, total, sampler=operation).sample())
    return {"distribution": f"cb {operation}", **result}


def count_step(preset: str, max_frames: int, precision: str = "fp32", floor: bool = False) -> dict:
    """One training step of ``preset`` (``bench_train.py``'s), its optimizer's update left out;
    with ``floor``, also ``floor_kernels`` and ``floor_reads``: the forward and backward of
    ``scripts/conformer_floor.py``'s minimal loop of the same sizes on the same batch."""
    import bench_train

    from cbasr.config.schema import register_configs
    from cbasr.training.asr_task import asr_trainer

    register_configs()
    args = argparse.Namespace(
        max_frames=max_frames, num_workers=0, num_threads=1, precision=precision, overrides=[]
    )
    with tempfile.TemporaryDirectory() as tmp:
        data = bench_train.synthetic_corpus(Path(tmp) / "data", utts=40)
        exp = Path(tmp) / "exp"
        trainer = asr_trainer(bench_train.make_config(preset, data, exp, args, "cpu"), exp)
        first, second = list(trainer.loader(trainer.task.sampler.batches()[:2]))
        trainer.train_step(first, 10)  # lazy state (optimizer moments) made outside the count
        counter = Counter()
        update = trainer.optimizer.step

        def uncounted(*a, **k):
            with counter.paused():
                return update(*a, **k)

        trainer.optimizer.step = uncounted
        from cbasr._backends import use_backend
        from cbasr.modules.decoders.monotonic import MonotonicAttentionDecoder as Monotonic

        blocks = Monotonic.band_elements  # the variable window's blocks as CUDA sizes them
        Monotonic.band_elements = {"cpu": blocks["cuda"]}
        try:
            with use_backend("triton"), counter:
                trainer.train_step(second, 10)
        finally:
            Monotonic.band_elements = blocks
        row = {"preset": preset, "utts": len(second.ids), **counter.result()}
        if floor:
            row.update(_count_floor(trainer, second, precision))
        return row


def _count_floor(trainer, batch, precision: str) -> dict:
    """The minimal loop's forward and backward on ``batch``, a fresh model's (it has no lazy
    state, and no gradient to accumulate into)."""
    import conformer_floor

    model = conformer_floor.floor_model(
        trainer.task.cfg, len(trainer.task.vocab), batch.feats.shape[-1]
    )
    with Counter() as counter:
        conformer_floor.floor_backward(model, batch, precision)
    return {"floor_kernels": counter.kernels, "floor_reads": counter.reads}


def _greedy_batch(name: str, batch: int):
    """``(label, model, h, h_lens)``: a trained experiment's model on the first ``batch`` test
    utterances of its recipe (``name`` a directory ``recipes/R/exp/E``, features in
    ``recipes/R/data/fbank/test``), or ``bench_search.py``'s random ``name`` model (``rnnt``,
    ``hat``) on random features of 200-800 frames, its blank bias set so that it emits about
    one label per 8 input frames (the synthetic corpus's phone rate)."""
    if Path(name).is_dir():
        from cbasr.data.features import FeatureStore
        from cbasr.inference.experiment import Experiment

        exp = Experiment(Path(name))
        store = FeatureStore(Path(name).resolve().parents[1] / "data/fbank/test")
        feats = [exp.normalise(store[utt]) for utt in list(store.index)[:batch]]
        lens = torch.tensor([f.shape[0] for f in feats])
        with torch.no_grad():
            h, h_lens = exp.model.encoder(torch.nn.utils.rnn.pad_sequence(feats, True), lens)
        return f"{Path(name).name} (trained)", exp.model, h, h_lens
    import bench_search

    model, h, h_lens = bench_search.random_transducer(name, batch)
    return f"{name} (random)", model, h, h_lens


def count_greedy(name: str, batch: int = 16, beams: tuple[int, ...] = ()) -> list[dict]:
    """A transducer's greedy search over one batch (:func:`_greedy_batch`), the encoder left
    out, one row per loop; and its beam search at each of ``beams``."""
    from cbasr.search import BeamSearchOptions, transducer_beam_search

    label, model, h, h_lens = _greedy_batch(name, batch)
    rows = []
    with torch.no_grad():
        for beam, merge in itertools.product(beams, ("host", "device")):
            # the prediction network stepped as on CUDA (masked_commit)
            options = BeamSearchOptions(beam=beam, max_symbols=model.max_symbols)
            result = count(
                lambda o=options, m=merge: transducer_beam_search(
                    model.decoder,
                    h,
                    h_lens,
                    o,
                    monotonic=model.monotonic,
                    masked_commit=True,
                    merge=m,
                )
            )
            name = f"{label} beam {beam}" + (
                ", prefixes on the device" if merge == "device" else ""
            )
            rows.append({"greedy": name, "utts": batch, **result})
        for loop in ("label", "frame"):
            model.greedy_loop = loop
            hyps: list = []
            result = count(lambda found=hyps: found.extend(model._greedy(h, h_lens)))
            rows.append(
                {
                    "greedy": f"{label} {loop}-looping",
                    "utts": len(hyps),
                    "frames": int(h_lens.sum()),
                    "max_frames": int(h_lens.max()),
                    "labels": sum(map(len, hyps)),
                    "max_labels": max(map(len, hyps)),
                    **result,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--losses", default="", help="comma-separated bench_losses.py names")
    parser.add_argument("--sizes", default="2,12,4,6", help="B,T,U,V for --losses")
    parser.add_argument(
        "--distributions", action="store_true", help="the CB distribution's log_prob, samplers"
    )
    parser.add_argument("--presets", default="", help="comma-separated bench_train.py presets")
    parser.add_argument("--max-frames", type=int, default=600, help="frames per batch (--presets)")
    parser.add_argument(
        "--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="--presets' autocast"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="--presets: also scripts/conformer_floor.py's minimal loop of the same sizes",
    )
    parser.add_argument(
        "--greedy",
        default="",
        help="comma-separated random transducers (rnnt, hat) or experiment dirs: greedy search",
    )
    parser.add_argument(
        "--beams", default="", help="comma-separated beam widths: --greedy's beam search too"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    if not (args.losses or args.distributions or args.presets or args.greedy):
        parser.error("give --losses, --distributions, --presets or --greedy")
    sizes = tuple(int(v) for v in args.sizes.split(","))
    rows = [count_loss(name, sizes) for name in filter(None, args.losses.split(","))]
    if args.distributions:
        rows += [count_distribution(op) for op in ("log_prob", "id_checking", "bounded", "draft")]
    rows += [
        count_step(name, args.max_frames, args.precision, args.floor)
        for name in filter(None, args.presets.split(","))
    ]
    for name in filter(None, args.greedy.split(",")):
        rows += count_greedy(name, beams=tuple(int(b) for b in filter(None, args.beams.split(","))))
    for row in rows:
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            what = row.get("loss") or row.get("distribution") or row.get("preset")
            what = what or row["greedy"]
            floor = ""
            if "floor_kernels" in row:
                floor = (
                    f"  (minimal loop: {row['floor_kernels']} kernels {row['floor_reads']} reads)"
                )
            print(
                f"{what:>14}: {row['kernels']:4d} kernels {row['triton']:2d} triton "
                f"{row['reads']:3d} reads{floor}"
            )


if __name__ == "__main__":
    main()
