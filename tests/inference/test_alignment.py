"""Forced alignments: the transducer best path against every lattice path, CTM files that
cover every reference label in order, onset errors recomputed from the CTM and the manifest's
gold times, the posterior plot, and refusals that name the problem."""

import json

import pytest
import torch

from cbasr.inference.alignment import (
    Alignment,
    _lattice_weights,
    align_split,
    cb_alignment,
    ctm_entries,
    onset_errors,
    subsampling_stride,
    transducer_alignment,
)
from cbasr.inference.experiment import Experiment
from tests.inference.fake_experiment import make_experiment
from tests.reference.lattice_enumeration import (
    cb_best_path,
    monotonic_transducer_paths,
    transducer_paths,
)


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)  # put back by tests/conftest.py


@pytest.mark.parametrize("decoder,loss", [("transducer", "rnnt"), ("hat", "hat")])
def test_the_transducer_best_path_is_the_best_of_every_lattice_path(
    tone_data, tmp_path, decoder, loss
):
    model = Experiment(make_experiment(tmp_path / "x", tone_data, decoder, loss, seed=1)).model
    torch.manual_seed(0)
    feats, lens, target = torch.randn(1, 10, 40), torch.tensor([10]), [2, 5, 2]
    aligned = transducer_alignment(model, feats, lens, [target])[0]
    with torch.no_grad():
        h, h_lens = model.encoder(feats, lens)
        blank, label = _lattice_weights(model, h, h_lens, torch.tensor([target]), torch.tensor([3]))
    best, best_frames = -float("inf"), None
    for moves in transducer_paths(int(h_lens[0]), 3):
        t = u = 0
        total, frames = 0.0, []
        for m in moves:
            if m == "b":
                total, t = total + float(blank[0, t, u]), t + 1
            else:
                total, u = total + float(label[0, t, u]), u + 1
                frames.append(t)
        if total > best:
            best, best_frames = total, frames
    assert aligned.start == best_frames


@pytest.mark.parametrize("decoder,loss", [("transducer", "rnnt"), ("hat", "hat")])
def test_the_monotonic_transducer_best_path_is_the_best_of_its_lattice_paths(
    tone_data, tmp_path, decoder, loss
):
    """One label per frame: the best of the C(T, U) paths, a repeated label included; more
    labels than frames is refused."""
    exp = make_experiment(
        tmp_path / "x", tone_data, decoder, loss, seed=2, loss_options={"topology": "monotonic"}
    )
    model = Experiment(exp).model
    assert model.monotonic and model.max_symbols == 1
    torch.manual_seed(1)
    feats, lens, target = torch.randn(1, 12, 40), torch.tensor([12]), [2, 2, 5]
    aligned = transducer_alignment(model, feats, lens, [target])[0]
    with torch.no_grad():
        h, h_lens = model.encoder(feats, lens)
        blank, label = _lattice_weights(model, h, h_lens, torch.tensor([target]), torch.tensor([3]))
    scored = []
    for moves in monotonic_transducer_paths(int(h_lens[0]), 3):
        u, total, frames = 0, 0.0, []
        for t, m in enumerate(moves):
            if m == "b":
                total += float(blank[0, t, u])
            else:
                total, u = total + float(label[0, t, u]), u + 1
                frames.append(t)
        scored.append((total, frames))
    scored.sort(reverse=True)
    assert scored[0][0] - scored[1][0] > 1e-6  # no tie at the top
    assert aligned.start == scored[0][1]
    frames = int(h_lens[0])
    with pytest.raises(ValueError, match=f"{frames + 1} labels in {frames} frames"):
        transducer_alignment(model, feats, lens, [[1] * (frames + 1)])


def test_cb_viterbi_times_are_the_best_emission_set(tone_data, tmp_path):
    """Against every emission set of each utterance alone; the short utterance's padded frames
    (7 encoder frames against its 3) must never be used."""
    model = Experiment(
        make_experiment(tmp_path / "x", tone_data, "attention_emission", "cb_marginal", seed=2)
    ).model
    for seed in range(3):
        torch.manual_seed(seed)
        feats, lens, targets = (
            3.0 * torch.randn(2, 14, 40),
            torch.tensor([14, 6]),
            [[2, 5, 2], [4, 1]],
        )
        aligned, post, enc_lens = cb_alignment(model, feats, lens, targets)
        for b, target in enumerate(targets):
            with torch.no_grad():
                emit, terms, _ = model.terms(
                    feats[b : b + 1, : lens[b]],
                    lens[b : b + 1],
                    torch.tensor([target]),
                    torch.tensor([len(target)]),
                )
            best, _ = cb_best_path(emit[0].double(), terms[0].double())
            assert aligned[b].start == list(best)
            total = post[b, : enc_lens[b], : len(target)].sum(0).tolist()
            assert total == pytest.approx([1.0] * len(target), abs=1e-4)


def _ctm(path):
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(r[0], int(r[1]), float(r[2]), float(r[3]), r[4]) for r in rows]


@pytest.mark.parametrize(
    "decoder,loss",
    [
        ("pointwise", "cb_marginal"),
        ("monotonic_variable", "cb_marginal"),
        ("pointwise", "ctc"),
        ("hat", "hat"),
    ],
)
def test_ctm_covers_every_reference_label_in_order_with_onset_errors(
    tone_data, tmp_path, decoder, loss
):
    exp = Experiment(make_experiment(tmp_path / "exp", tone_data, decoder, loss))
    out = tmp_path / "align"
    summary = align_split(exp, tone_data / "corpus/dev.jsonl", tone_data / "fbank/dev", out)
    corpus = {
        r["id"]: r
        for r in map(json.loads, (tone_data / "corpus/dev.jsonl").read_text().splitlines())
    }
    ctm = _ctm(out / "align.ctm")
    assert (
        summary["utts"] == 16
        and summary["skipped"] == 0
        and summary["frame_period"] == pytest.approx(0.02)
    )
    errors = []
    for utt, record in corpus.items():
        rows = [r for r in ctm if r[0] == utt]
        assert [r[4] for r in rows] == record["phones"] and all(r[1] == 1 for r in rows)
        starts = [r[2] for r in rows]
        assert starts == sorted(starts) and starts[-1] < record["duration"]
        if loss != "hat":  # one label per frame at most: strictly increasing
            assert len(set(starts)) == len(starts)
        errors += [abs(s - g) for s, g in zip(starts, record["phone_starts"])]
    assert summary["labels_with_gold"] == len(errors)
    assert summary["mean_abs_onset_error_ms"] == pytest.approx(
        1000 * sum(errors) / len(errors), abs=0.01
    )
    assert summary["within_20ms"] == pytest.approx(
        sum(e <= 0.020 + 1e-6 for e in errors) / len(errors), abs=1e-3
    )
    if loss == "cb_marginal":
        plot = out / f"posteriors_{sorted(corpus)[0]}.png"
        assert summary["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert summary["plot"] is None


def test_refusals_name_the_problem(tone_data, tmp_path):
    exp = Experiment(make_experiment(tmp_path / "ar", tone_data, "autoregressive", "cb_reinforce"))
    with pytest.raises(ValueError, match="AutoregressiveDecoder depends on every earlier one"):
        align_split(exp, tone_data / "corpus/dev.jsonl", tone_data / "fbank/dev", tmp_path / "a")
    exp = Experiment(make_experiment(tmp_path / "pw", tone_data, "pointwise", "cb_marginal"))
    with pytest.raises(ValueError, match="--plot-utt 'nope' is not an alignable utterance"):
        align_split(
            exp,
            tone_data / "corpus/dev.jsonl",
            tone_data / "fbank/dev",
            tmp_path / "a",
            plot_utt="nope",
        )


def test_onset_errors_and_the_frame_period():
    entries = ctm_entries("u", Alignment([0, 3], [1, 2]), ["a", "b"], 0.02)
    assert entries == [("u", 0.0, 0.02, "a"), ("u", pytest.approx(0.06), pytest.approx(0.04), "b")]
    assert onset_errors([0.0, 0.12, 0.30], [0.01, 0.10, 0.33]) == pytest.approx([0.01, 0.02, 0.03])
    with pytest.raises(ValueError, match="3 aligned labels but 2 gold"):
        onset_errors([0.0, 0.1, 0.2], [0.0, 0.1])

    class Stride3:
        def output_frames(self, n):
            return (n + 2) // 3

    class Conv4:
        def output_frames(self, n):
            return ((n - 1) // 2 - 1) // 2

    assert subsampling_stride(Stride3()) == 3 and subsampling_stride(Conv4()) == 4


def test_the_stride_is_at_least_one_frame_and_an_encoder_with_no_output_is_not_a_crash():
    class Upsampling:
        def output_frames(self, n):
            return 4 * n

    class Silent:
        def output_frames(self, n):
            return 0

    assert subsampling_stride(Upsampling()) == 1
    assert subsampling_stride(Silent()) == 3000


def test_the_frame_shift_is_the_feature_records_else_10_ms(tmp_path):
    import json

    from cbasr.inference.experiment import frame_shift_seconds

    assert frame_shift_seconds(tmp_path) == 0.01  # no .done record
    (tmp_path / ".done").write_text(json.dumps({"params": {"frame_shift_ms": 25.0}}))
    assert frame_shift_seconds(tmp_path) == pytest.approx(0.025)
    (tmp_path / ".done").write_text(json.dumps({"params": {"num_mel_bins": 80}}))
    assert frame_shift_seconds(tmp_path) == pytest.approx(0.01)


def test_a_tdt_model_is_refused_by_name():
    from cbasr import builder

    encoder = {"name": "rnn", "hidden": 8, "num_layers": 1, "stack": 1, "stride": 1}
    model = builder.build_model(
        encoder, {"name": "transducer", "joint": "tdt"}, {"name": "tdt"}, 5, 3
    )
    with pytest.raises(ValueError, match="TDT"):
        transducer_alignment(model.eval(), torch.randn(1, 4, 5), torch.tensor([4]), [[1]])
