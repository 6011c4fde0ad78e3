"""The transducers' greedy searches: label-looping gives frame-looping's hypotheses, with one
prediction-network step per emitted label position and no host read of which rows emitted."""

import pytest
import torch

from cbasr import builder
from cbasr.models.transducer_greedy import (
    MAX_WINDOW,
    LabelLoopingGraphs,
    frame_looping_greedy,
    label_looping_greedy,
    tdt_greedy,
)
from cbasr.modules.decoders.transducer import per_row
from tests.search import tiny


def _searches(model, feats, lens, window: int = 4):
    h, h_lens = model.encoder(feats, lens)
    rule, cap = model.greedy, model.max_symbols
    with torch.no_grad():
        frame = frame_looping_greedy(model.decoder, h, h_lens, cap, rule, frames=True)
        label = label_looping_greedy(model.decoder, h, h_lens, cap, rule, window, frames=True)
        assert label_looping_greedy(model.decoder, h, h_lens, cap, rule, window) == label.labels
    assert label.frames == frame.frames  # each label emitted on the same frame
    for at, n in zip(frame.frames, h_lens.tolist()):
        assert at == sorted(at) and all(0 <= t < n for t in at)
    return frame.labels, label.labels


def _blank_bias(model) -> torch.Tensor:
    joint = model.decoder.joint
    if getattr(joint, "linear_blank", False):
        return joint.blank_encoder.bias
    return joint.out[-1].bias[:1]  # unit 0: the blank (RNN-T) or the blank logit (HAT)


def _emitting(name: str, options: dict, share: float):
    """A tiny random model whose blank bias is moved (by bisection) until its greedy search
    emits about ``share`` of the most it can (``max_symbols`` per frame): random transducers
    otherwise emit on every frame or on none, and neither tests how rows move apart."""
    model = tiny.build(name, seed=3, loss_options=options, dtype=torch.float64)
    feats, lens = tiny.batch(seed=4, lengths=(23, 17, 9, 4, 12))
    h, h_lens = model.encoder(feats, lens)
    most = model.max_symbols * int(h_lens.sum())
    bias, low, high = _blank_bias(model), -30.0, 30.0
    base = bias.detach().clone()
    for _ in range(40):
        middle = (low + high) / 2
        with torch.no_grad():
            bias.copy_(base + middle)
        hyps = frame_looping_greedy(model.decoder, h, h_lens, model.max_symbols, model.greedy)
        emitted = sum(map(len, hyps)) / most
        if abs(emitted - share) < 0.05:
            break
        low, high = (middle, high) if emitted > share else (low, middle)
    return model, feats, lens


@pytest.mark.parametrize("name", tiny.TRANSDUCERS)
@pytest.mark.parametrize("rule", ["label", "emission"])
@pytest.mark.parametrize("max_symbols", [1, 3])
@pytest.mark.parametrize("share,window", [(0.15, 1), (0.15, 4), (0.5, 3)])
def test_label_looping_gives_the_frame_looping_hypotheses(name, rule, max_symbols, share, window):
    """Every frame window (1: one frame per inner step, as Bataev et al.; 3, 4: several, and
    twice as many again while a row finds no label) takes frame-looping's decisions."""
    options = {"greedy": rule, "max_symbols": max_symbols}
    model, feats, lens = _emitting(name, options, share)
    frame, label = _searches(model, feats, lens, window)
    assert label == frame
    most = [max_symbols * model.output_frames(int(n)) for n in lens]
    assert 0 < sum(map(len, frame)) < sum(most)  # neither every label nor none
    assert any(0 < len(y) < m for y, m in zip(frame, most))  # a row emits and moves on


@pytest.mark.parametrize("name", ["transducer", "hat"])
def test_label_looping_on_the_monotonic_topology(name):
    model = tiny.build(name, seed=1, shift=2.0, loss_options={"topology": "monotonic"})
    feats, lens = tiny.batch(seed=2)
    frame, label = _searches(model, feats, lens)
    assert label == frame and any(len(y) > 2 for y in label)
    assert model.greedy_decode(feats, lens) == label  # the default on the CPU: label-looping
    assert model.greedy_loop == "auto" and model._graphs is None


@pytest.mark.parametrize("max_symbols", [1, 2, 4])
def test_a_joint_that_always_emits_stops_at_max_symbols_per_frame(max_symbols):
    model = tiny.build("transducer", seed=0, loss_options={"max_symbols": max_symbols})
    with torch.no_grad():
        model.decoder.joint.out[-1].bias[0] = -100.0  # the blank never wins
    width = model.decoder.joint.encoder_proj.in_features
    h, lens = torch.randn(3, 5, width), torch.tensor([5, 2, 0])
    hyps = label_looping_greedy(model.decoder, h, lens, max_symbols, "label")
    assert [len(y) for y in hyps] == [5 * max_symbols, 2 * max_symbols, 0]
    assert hyps == frame_looping_greedy(model.decoder, h, lens, max_symbols, "label")


def test_a_window_of_the_whole_utterance_calls_the_joint_once_per_label_position():
    """With a window of every frame, each outer step is one inner step: one joint call per
    label position of the longest hypothesis (and a last one where every row runs out), where
    frame-looping calls it on every frame and again after every emission."""
    model, feats, lens = _emitting("hat", {}, 0.3)
    h, h_lens = model.encoder(feats, lens)
    calls = []
    model.decoder.joint.out.register_forward_hook(lambda *args: calls.append(1))
    frame = frame_looping_greedy(model.decoder, h, h_lens, 4, "label")
    frame_calls, calls[:] = len(calls), []
    label = label_looping_greedy(model.decoder, h, h_lens, 4, "label", window=h.shape[1])
    assert label == frame
    longest = max(map(len, label))
    assert len(calls) in (longest, longest + 1)
    assert frame_calls >= int(h_lens.max()) + longest
    with pytest.raises(ValueError, match="window must be >= 1 frame, got 0"):
        label_looping_greedy(model.decoder, h, h_lens, 4, "label", window=0)


def test_one_prediction_step_per_label_position_and_no_read_of_the_emitting_rows():
    """The prediction network steps once per outer iteration, for the whole batch (the start
    symbol, then one step per label position: the longest hypothesis's length, plus a last
    step where every row ran out of frames); frame-looping steps on every frame where a row
    emits. Label-looping never calls ``commit``, whose ``nonzero`` reads the device."""
    model = tiny.build("hat", seed=3, shift=1.5)
    feats, lens = tiny.batch(seed=4, lengths=(23, 17, 9, 4, 12))
    h, h_lens = model.encoder(feats, lens)
    steps = []
    step = model.decoder.prediction.step
    model.decoder.prediction.step = lambda *a: steps.append(1) or step(*a)
    frame = frame_looping_greedy(model.decoder, h, h_lens, 4, "label")
    frame_steps, steps[:] = len(steps), []

    def refuse(*args):
        raise AssertionError("label-looping read the emitting rows on the host (commit)")

    model.decoder.commit = refuse
    label = label_looping_greedy(model.decoder, h, h_lens, 4, "label")
    assert label == frame
    longest = max(len(y) for y in label)
    assert longest >= 4 and len(steps) in (1 + longest, 2 + longest)
    assert len(steps) < frame_steps


@pytest.mark.parametrize("loop", ["label", "frame"])
@pytest.mark.parametrize("name", ["transducer", "hat"])
def test_the_emission_greedy_rule_finds_a_word_whose_label_is_not_sure(name, loop):
    """Frames 1-3 of 6 hold a word: P(blank) = 0.4 there, and the label mass 0.6 is shared by
    the labels (the best has 0.3). The "label" rule never emits it (0.3 < 0.4); the
    "emission" rule emits the best label once (0.6 > 0.4), after which the blank is sure."""
    label_share = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()  # V - 1 = 4 labels

    def frame_scores(state, t):  # t: an int (frame-looping) or (B, W) frames (label-looping)
        emitted = per_row(state["count"], t)  # (B,) or (B, 1)
        word = (t >= 1) & (t <= 3) & (emitted == 0)
        blank = torch.where(word, 0.4, 0.95).log()
        labels = torch.where(word, 0.6, 0.05).log()[..., None] + label_share
        return blank, labels

    def commit(state, emitted, labels):
        return {"count": state["count"] + emitted.long()}

    hyps = {}
    for rule in ("label", "emission"):
        model = tiny.build(name, seed=1, loss_options={"greedy": rule})
        model.greedy_loop = loop
        model.decoder.begin = lambda h, lens: {"count": torch.zeros(h.shape[0], dtype=torch.long)}
        model.decoder.frame_scores = frame_scores
        model.decoder.commit = model.decoder.commit_masked = commit
        hyps[rule] = model._greedy(torch.zeros(2, 6, 1), torch.tensor([6, 2]))
    assert hyps["label"] == [[], []]
    assert hyps["emission"] == [[1], [1]]


@pytest.mark.parametrize("loop", ["label", "frame"])
def test_a_label_that_ties_with_the_blank_is_not_emitted(loop):
    """P(blank) = P(best label) = 0.5 on every frame: nothing is emitted, as the label must
    beat the blank; with a hair less blank, the cap of labels on every frame."""

    def scores(margin: float):
        def frame_scores(state, t):  # (B,) or (B, W) scores for frames t
            shape = (2,) if isinstance(t, int) else tuple(t.shape)
            labels = torch.tensor([0.5, 0.0, 0.0]).log().expand(*shape, 3)
            return torch.full(shape, 0.5).log() - margin, labels

        return frame_scores

    model = tiny.build("transducer", seed=1)
    model.greedy_loop = loop
    model.decoder.begin = lambda h, lens: {}
    model.decoder.commit = model.decoder.commit_masked = lambda state, emitted, labels: state
    h, lens = torch.zeros(2, 5, 1), torch.tensor([5, 3])
    model.decoder.frame_scores = scores(0.0)
    assert model._greedy(h, lens) == [[], []]
    model.decoder.frame_scores = scores(1e-6)
    assert [len(y) for y in model._greedy(h, lens)] == [5 * 4, 3 * 4]


@pytest.mark.parametrize("loop", ["label", "frame"])
def test_a_long_blank_stretch_is_crossed_in_windows_of_at_most_max_window_frames(loop):
    """One label, on frame 150 of 200: label-looping looks at 4, 8, ... frames, at most
    MAX_WINDOW at once, and finds it where frame-looping does."""
    widths = []

    def frame_scores(state, t):
        if not isinstance(t, int):
            widths.append(t.shape[1])
        word = (t == 150) & (per_row(state["count"], t) == 0)
        labels = torch.where(word, 0.0, -20.0)[..., None] + torch.tensor([0.0, -5.0, -5.0])
        return torch.where(word, -5.0, 0.0), labels

    model = tiny.build("transducer", seed=1)
    model.greedy_loop = loop
    model.decoder.begin = lambda h, lens: {"count": torch.zeros(h.shape[0], dtype=torch.long)}
    model.decoder.frame_scores = frame_scores
    model.decoder.commit = model.decoder.commit_masked = lambda state, emitted, labels: {
        "count": state["count"] + emitted.long()
    }
    assert model._greedy(torch.zeros(2, 200, 1), torch.tensor([200, 100])) == [[1], []]
    if loop == "label":
        assert max(widths) == MAX_WINDOW and widths[:3] == [4, 8, 16]


def test_graphs_need_cuda_and_an_unknown_loop_is_refused():
    model = tiny.build("hat", seed=1)
    feats, lens = tiny.batch(seed=2)
    model.greedy_loop = "graphs"
    with pytest.raises(ValueError, match="needs a CUDA device, not cpu: use greedy_loop='label'"):
        model.greedy_decode(feats, lens)
    model.greedy_loop = "labels"
    with pytest.raises(ValueError, match="must be auto, label, graphs or frame, got 'labels'"):
        model.greedy_decode(feats, lens)
    with pytest.raises(ValueError, match="bucket and shapes must be >= 1, got 4, 0, 8"):
        LabelLoopingGraphs(model.decoder, 4, "label", bucket=0)


def _graphs_match(name, rule, max_symbols, device, graphs):
    options = {"greedy": rule, "max_symbols": max_symbols}
    model, feats, lens = _emitting(name, options, 0.3)
    model = model.float().to(device).eval()
    feats, lens = feats.float().to(device), lens.to(device)
    with torch.no_grad():
        h, h_lens = model.encoder(feats, lens)
    search = LabelLoopingGraphs(
        model.decoder, max_symbols, rule, bucket=16, shapes=1, graphs=graphs
    )
    others = (h.flip(0), h_lens.flip(0).clamp(max=h.shape[1] - 3))  # same padded shape
    for batch in [(h, h_lens), others, (h[:3], h_lens[:3]), (h, h_lens)]:
        with torch.no_grad():
            frame = frame_looping_greedy(model.decoder, *batch, max_symbols, rule, frames=True)
            replayed = search(*batch, frames=True)
        assert replayed == frame and sum(map(len, frame.labels)) > 0
        assert search(*batch) == frame.labels
    assert len(search._captured) == 1
    return model, feats, lens, search(h, h_lens)


@pytest.mark.parametrize("name", tiny.TRANSDUCERS)
@pytest.mark.parametrize("rule,max_symbols", [("label", 1), ("label", 3), ("emission", 2)])
def test_the_static_steps_give_the_frame_looping_hypotheses(name, rule, max_symbols):
    """The graphs' steps, run eagerly on their static tensors (``graphs=False``), take the
    eager searches' decisions: on a batch, on another batch of the same padded shape (the
    static tensors rewritten, a shorter last frame), and again after the steps of another
    shape evicted them (``shapes=1``)."""
    _graphs_match(name, rule, max_symbols, "cpu", graphs=False)


def test_the_static_steps_serve_inference_mode_and_no_grad_apart():
    """Static tensors made under ``torch.inference_mode`` take no in-place update outside it:
    a search called both ways keeps a set for each, and both give the same hypotheses."""
    model = tiny.build("hat", seed=1, shift=1.5).float().eval()
    feats, lens = tiny.batch(seed=2)
    with torch.no_grad():
        h, h_lens = model.encoder(feats.float(), lens)
    search = LabelLoopingGraphs(model.decoder, 4, "label", graphs=False)
    with torch.inference_mode():
        first = search(h, h_lens)
    with torch.no_grad():
        again = search(h, h_lens)
    assert first == again and sum(map(len, first)) > 0 and len(search._captured) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", tiny.TRANSDUCERS)
@pytest.mark.parametrize("rule,max_symbols", [("label", 1), ("label", 3), ("emission", 2)])
def test_graphs_give_the_frame_looping_hypotheses_on_cuda(name, rule, max_symbols, device):
    """The same, replayed from CUDA graphs; and the model's ``greedy_loop="graphs"``."""
    model, feats, lens, hyps = _graphs_match(name, rule, max_symbols, device, graphs=True)
    assert model.greedy_loop == "auto" and model._graphs is None
    assert model.greedy_decode(feats, lens) == hyps  # the default on a GPU: graphs
    assert model._graphs is not None and len(model._graphs._captured) == 1


def test_static_runs_write_each_step_into_the_loop_s_variables():
    """The static variables are the first values' copies, each run writes its phase's results
    into them (a value returned unchanged is kept), and a phase that changes the variables'
    structure is refused, naming it."""
    from cbasr.models.transducer_greedy import static_runs

    first = {"x": torch.zeros(3), "n": torch.tensor(0)}
    variables, (step, bad) = static_runs(
        [lambda v: {"x": v["x"] + 2, "n": v["n"] + 1}, lambda v: {"x": v["x"]}], first
    )
    assert variables["x"] is not first["x"]
    x = variables["x"]
    step()
    step()
    assert variables["x"] is x and x.tolist() == [4.0] * 3 and int(variables["n"]) == 2
    assert first["x"].tolist() == [0.0] * 3
    with pytest.raises(RuntimeError, match="a step changed the loop's variables"):
        bad()


# --- TDT -------------------------------------------------------------------------------------


def _tdt_greedy_oracle(decoder, h, lens, max_symbols: int):
    """The TDT greedy search as it was written before its prediction network ran on the
    emitting rows alone (kept as the oracle): every row one frame a step, the prediction
    network stepped under a mask on every step. ``(labels, frames)`` per utterance."""
    joint = decoder.joint
    state = decoder.begin(h, lens)
    B, T = h.shape[:2]
    durations = torch.tensor(joint.durations)
    stays = durations == 0
    t = torch.zeros(B, dtype=torch.long)
    symbols = torch.zeros_like(t)
    labels, frames = [[] for _ in range(B)], [[] for _ in range(B)]
    while bool((active := t < lens).any()):
        tokens, durs = joint.frame_tokens_durations(joint.frame_units(state, t, state["g"]))
        token = tokens.argmax(dim=-1)
        blank = token == 0
        step = torch.where(
            blank, durs.masked_fill(stays, float("-inf")).argmax(dim=-1), durs.argmax(dim=-1)
        )
        d = durations[step]
        emitted = active & ~blank
        for b in emitted.nonzero().flatten().tolist():
            labels[b].append(int(token[b]))
            frames[b].append(int(t[b]))
        state = decoder.commit_masked(state, emitted, token)
        symbols = torch.where(emitted & (d == 0), symbols + 1, 0)
        moved_on = symbols >= max_symbols
        d = torch.where(moved_on, 1, d)
        symbols = torch.where(moved_on, 0, symbols)
        t = torch.where(active, t + d, t)
    return labels, frames


def _tdt(durations, seed: int, max_symbols: int, blank: float, stay: float, context: int = -1):
    """A random TDT model whose blank and duration-0 biases are moved by ``blank``, ``stay``."""
    torch.manual_seed(seed)
    encoder = {"name": "rnn", "hidden": 8, "num_layers": 1, "stack": 1, "stride": 1, "dropout": 0.0}
    label = {"context": context, "embed_dim": 4, "hidden": 8}
    decoder = {"name": "transducer", "joint": "tdt", "durations": list(durations),
               "label": label, "joint_dim": 8}  # fmt: skip
    loss = {"name": "tdt", "max_symbols": max_symbols}
    model = builder.build_model(encoder, decoder, loss, 5, 4).eval()
    joint = model.decoder.joint
    with torch.no_grad():
        joint.out[-1].weight.mul_(3.0)  # sharper: the searches face real choices
        joint.out[-1].bias[0] += blank
        if 0 in durations:
            joint.out[-1].bias[joint.vocab_size + durations.index(0)] += stay
    return model


@pytest.mark.parametrize(
    "durations,max_symbols,blank,stay,context",
    [
        ((0, 1, 2, 3, 4), 4, 0.0, 0.0, -1),
        ((0, 1, 2, 3, 4), 2, -1.0, 0.0, -1),
        ((0, 1, 2, 3, 4), 2, -0.5, 0.5, -1),  # many labels of duration 0: the cap binds
        ((0, 1, 2), 1, 0.5, 0.0, 2),  # the last two labels as the prediction network
        ((1, 2, 4), 3, 0.0, 0.0, -1),  # no duration 0
        ((0, 1), 3, 0.0, 0.0, 0),  # a prediction network of no label
    ],
)
@pytest.mark.parametrize("masked", [False, True])
def test_tdt_greedy_gives_the_oracle_s_hypotheses(
    durations, max_symbols, blank, stay, context, masked
):
    """Random models and batches of several lengths (one without frames): the labels and
    their frames of the oracle, the emitting rows stepped alone or every row under a mask."""
    counts = []
    for seed in range(3):
        model = _tdt(durations, seed, max_symbols, blank, stay, context)
        g = torch.Generator().manual_seed(seed)
        lens = torch.tensor([19, 11, 0, 7, 16])
        feats = torch.randn(len(lens), int(lens.max()), 5, generator=g)
        with torch.no_grad():
            h, h_lens = model.encoder(feats, lens)
            found = tdt_greedy(model.decoder, h, h_lens, max_symbols, frames=True, masked=masked)
            oracle = _tdt_greedy_oracle(model.decoder, h, h_lens, max_symbols)
        assert (found.labels, found.frames) == oracle
        assert tdt_greedy(model.decoder, h, h_lens, max_symbols, masked=masked) == oracle[0]
        counts.append(sum(map(len, found.labels)))
    assert any(0 < n < int(h_lens.sum()) * max_symbols for n in counts), counts  # choices made


def test_tdt_greedy_steps_the_prediction_network_once_per_label_on_the_emitting_rows():
    """On the CPU the prediction network reads the emitted labels alone: the start symbol for
    every row, then one row per label; no step at all where no row emitted."""
    model = _tdt((0, 1, 2, 3, 4), 1, 2, -1.0, 0.0)
    lens = torch.tensor([19, 11, 7, 16])
    feats = torch.randn(len(lens), int(lens.max()), 5, generator=torch.Generator().manual_seed(1))
    rows = []
    step = model.decoder.prediction.step
    model.decoder.prediction.step = lambda labels, *a: (
        rows.append(labels.numel()) or step(labels, *a)
    )
    with torch.no_grad():
        h, h_lens = model.encoder(feats, lens)
        hyps = tdt_greedy(model.decoder, h, h_lens, 2)
    labels = sum(map(len, hyps))
    assert labels > 10 and rows[0] == len(lens) and sum(rows[1:]) == labels
    assert all(n > 0 for n in rows)
