"""scripts/count_launches.py: kernels, Triton launches and device reads, counted on the CPU."""

import json
import sys
from pathlib import Path

import pytest
import torch

from cbasr._backends import triton_interpreted
from cbasr.config.schema import LabelContextConfig
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(not triton_interpreted(), reason="counts the CPU run of the CUDA path"),
]


@pytest.fixture(scope="module")
def count_launches():
    sys.path.insert(0, str(ROOT / "scripts"))  # it imports bench_losses beside it
    try:
        yield load_script("count_launches")
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_the_counter_tells_kernels_from_views_and_reads(count_launches):
    x = torch.arange(6.0)

    def known():
        y = x * 2  # a kernel
        s = y.sum()  # a kernel
        y.view(2, 3).transpose(0, 1)  # views: none
        s.item()  # a read
        y.tolist()  # a read that dispatches no operator on the CPU
        y.nonzero()  # a read: its size depends on the values
        int(s)  # a read

    assert count_launches.count(known) == {
        "kernels": 2,
        "triton": 0,
        "reads": 4,
        "triton_kernels": {},
    }
    assert torch.Tensor.tolist.__name__ == "tolist"  # put back after counting


def test_losses_read_the_device_once(count_launches):
    """Each loss's value checks share one read (cbasr.checks.one_read); the CB and HAT losses
    run their lattices as Triton kernels, forward then backward, HAT's joint passes too."""
    rows = {
        loss: count_launches.count_loss(loss, (2, 6, 3, 5)) for loss in ("ctc", "cb", "hat_fused")
    }
    assert [rows[loss]["reads"] for loss in rows] == [1, 1, 1]
    assert rows["ctc"]["triton"] == 0 and rows["ctc"]["kernels"] > 0
    assert rows["cb"]["triton_kernels"] == {
        "_marginal_forward_kernel": 1,
        "_marginal_backward_kernel": 1,
    }
    assert rows["hat_fused"]["triton_kernels"] == {
        "_joint_edges_kernel": 1,
        "_lattice_forward_kernel": 1,
        "_lattice_backward_kernel": 1,
        "_joint_grad_kernel": 1,
    }
    # the edges, masks, shifts and the joint's gradient inside them (issue target: <= 25)
    assert rows["hat_fused"]["kernels"] <= 25


def test_the_table_names_each_row_by_its_loss(count_launches, capsys):
    count_launches.main(["--losses", "ctc"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].split(":")[0].strip() == "ctc", lines
    assert lines[0].endswith(" 0 triton   1 reads"), lines


@pytest.mark.parametrize("lengths", [(8, 5), (23, 17)])
def test_beam_search_with_device_prefixes_reads_a_few_times_a_batch(count_launches, lengths):
    """Transducer beam search: with the prefixes on the host it reads the device every frame
    (its candidates, the kept ones, the next beam); with them on the device, five times a
    batch whatever its length (the traced-back labels and the final scores), and the prefix
    searches' ranking reads nothing when a beam width is given."""
    from cbasr.search import BeamSearchOptions, transducer_beam_search
    from cbasr.search.prefix import select
    from tests.search import tiny

    model = tiny.build("hat", seed=3, shift=1.5)
    h, h_lens = model.encoder(*tiny.batch(seed=6, lengths=lengths))
    options = BeamSearchOptions(beam=4, max_symbols=2)
    reads = {
        merge: count_launches.count(
            lambda m=merge: transducer_beam_search(model.decoder, h, h_lens, options, merge=m)
        )["reads"]
        for merge in ("host", "device")
    }
    assert reads["host"] >= 3 * h.shape[1]
    assert reads["device"] == 5  # and the prediction network stepped under a mask, by default
    assert count_launches.count(lambda: select(torch.randn(2, 9), 3))["reads"] == 0
    assert count_launches.count(lambda: select(torch.randn(2, 9), None))["reads"] == 1


@pytest.mark.slow  # the synth-size model's calibration: about 30 s
def test_label_looping_reads_the_device_once_per_step_of_its_loops(count_launches):
    """A random HAT model's greedy search over 2 utterances: label-looping reads per label
    position (and the windows' extra steps), frame-looping per frame and emission; the same
    labels."""
    label, frame = count_launches.count_greedy("hat", batch=2)
    assert label["greedy"] == "hat (random) label-looping"
    assert frame["greedy"] == "hat (random) frame-looping"
    assert label["labels"] == frame["labels"] > 0
    assert frame["reads"] >= label["max_frames"]
    assert label["reads"] <= 3 * (label["max_labels"] + 1) < frame["reads"]


def test_the_cb_distribution_and_the_simple_loss_run_in_their_kernels(count_launches):
    """The CB distribution's log_prob (with its backward and argument checks) and ID-checking
    sampling, and the pruned loss with its simple loss, each a few PyTorch operators around
    their Triton kernels (issue targets: <= 25 for the distribution)."""
    log_prob = count_launches.count_distribution("log_prob")
    assert log_prob["triton_kernels"] == {"_log_prob_kernel": 1, "_log_prob_backward_kernel": 1}
    assert log_prob["kernels"] <= 25 and log_prob["reads"] == 3
    sample = count_launches.count_distribution("id_checking")
    assert sample["triton_kernels"] == {
        "_tilt_kernel": 1,
        "_suffix_kernel": 1,
        "_id_checking_kernel": 1,
    }
    assert sample["kernels"] <= 25
    pruned = count_launches.count_loss("hat_pruned", (2, 6, 3, 5))
    assert pruned["triton_kernels"] == {
        "_simple_edges_kernel": 1,
        "_lattice_forward_kernel": 2,
        "_lattice_backward_kernel": 2,
        "_windows_kernel": 1,
        "_simple_grad_am_kernel": 1,
        "_simple_grad_lm_kernel": 1,
        "_joint_edges_kernel": 1,
        "_joint_grad_kernel": 1,
    }
    assert pruned["kernels"] <= 50 and pruned["reads"] == 2


def test_the_variable_window_queues_as_many_kernels_for_a_long_band_as_a_short_one(
    count_launches,
):
    """The second-order monotonic decoder's label terms with their backward, in CUDA's block
    size: a band of 4 diagonals and one of 40 launch the same kernels (one per diagonal
    before: 2963 PyTorch kernels a cb_monotonic_variable step, 321 for cb_monotonic)."""
    from cbasr.modules.decoders import MonotonicAttentionDecoder

    torch.manual_seed(0)
    decoder = MonotonicAttentionDecoder(
        6, 7, window=4, variable=True, attention_dim=4, label=LabelContextConfig(hidden=5)
    )
    decoder.band_elements = {"cpu": MonotonicAttentionDecoder.band_elements["cuda"]}
    counts = []
    for frames in (8, 44):  # 5 labels: K = 4 and 40 diagonals
        h = torch.randn(2, frames, 6, requires_grad=True)
        targets = torch.randint(1, 7, (2, 5))

        def terms(h=h, targets=targets, frames=frames):
            lens, target_lens = torch.tensor([frames, frames - 1]), torch.tensor([5, 3])
            decoder.cb_terms(h, lens, targets, target_lens)[1].sum().backward()

        decoder.zero_grad()  # no gradient to accumulate into: the same first backward
        counts.append(count_launches.count(terms))
    assert counts[0] == counts[1], counts
    assert counts[0]["kernels"] <= 150 and counts[0]["reads"] == 1


def test_the_variable_window_reads_nothing_in_a_graph_step(count_launches):
    """In a step of ``trainer.cuda_graphs`` the band starts at every frame (its width is not
    read from the lengths): no read of the device, and the same label terms."""
    from cbasr.checks import graph_step
    from cbasr.modules.decoders import MonotonicAttentionDecoder

    torch.manual_seed(0)
    decoder = MonotonicAttentionDecoder(
        6, 7, window=4, variable=True, attention_dim=4, label=LabelContextConfig(hidden=5)
    )
    decoder.eval()
    h, targets = torch.randn(2, 9, 6), torch.randint(1, 7, (2, 5))
    lens, target_lens = torch.tensor([9, 7]), torch.tensor([5, 2])
    eager = decoder.cb_terms(h, lens, targets, target_lens)[1]
    found = []
    with graph_step():
        counts = count_launches.count(
            lambda: found.append(decoder.cb_terms(h, lens, targets, target_lens)[1])
        )
    assert counts["reads"] == 0, counts
    torch.testing.assert_close(found[0], eager, rtol=0, atol=1e-6)
    assert eager.abs().sum() > 0


def test_the_conformer_layers_launch_no_more_kernels_than_torchaudio_s(count_launches):
    """The encoder runs torchaudio's Conformer layers itself: forward and backward on the
    same frames queue no more PyTorch kernels than torchaudio's own forward does (its
    self-attention projects queries, keys and values in one product, as torchaudio's: 141
    kernels against 168 here; with one product per projection, 177)."""
    from cbasr.modules.encoders import ConformerEncoder

    torch.manual_seed(0)
    enc = ConformerEncoder(
        20, d_model=16, num_heads=2, ffn_dim=32, num_layers=2, kernel_size=5, dropout=0.0,
        subsampling="none",
    )  # fmt: skip
    lens = torch.tensor([26, 11, 17])
    z = enc.proj(torch.randn(3, 26, 20)).detach().requires_grad_()
    theirs = count_launches.count(lambda: enc.conformer(z, lens)[0].sum().backward())
    enc.zero_grad()  # the same first backward: no gradient to accumulate into
    z.grad = None
    valid = torch.arange(26) < lens[:, None]
    ours = count_launches.count(lambda: enc._layers(z, valid).sum().backward())
    assert z.grad is not None and all(p.grad is not None for p in enc.conformer.parameters())
    assert ours["kernels"] <= theirs["kernels"], (ours, theirs)


@pytest.mark.slow  # two models' steps counted, one of them twice: about 10 s
def test_a_conformer_step_launches_about_what_the_minimal_loop_does(count_launches, capsys):
    """A ``conformer_ctc`` training step in bf16 (SpecAugment, the padding masks, the checks
    and clipping included) against the minimal loop of ``scripts/conformer_floor.py`` on the
    same batch (``--floor``): within 5% of its kernels (720 against 706; in float32 521
    against 507, and 601 before self-attention's three projections became one product).
    Without ``--floor``, the step's counts alone, the same."""
    count_launches.main(["--presets", "conformer_ctc", "--precision", "bf16", "--floor", "--json"])
    (line,) = capsys.readouterr().out.splitlines()
    row = json.loads(line)
    assert row["kernels"] > 100 and row["floor_kernels"] > 100 and row["floor_reads"] >= 1, row
    assert row["kernels"] <= 1.05 * row["floor_kernels"], row
    alone = count_launches.count_step("conformer_ctc", 600, "bf16")
    assert "floor_kernels" not in alone and alone["kernels"] == row["kernels"], alone


def test_one_process_s_training_step_reads_the_device_twice(count_launches):
    """A ``blstm_ctc`` step: the loss's checks, then the trainer's one read after the backward
    (the gradient norm, the losses' finiteness, the NLL sum and the statistics together); one
    process reads nothing before the backward."""
    row = count_launches.count_step("blstm_ctc", 600)
    assert row["reads"] == 2, row
