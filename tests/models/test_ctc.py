import torch

from cbasr.builder import build_model
from cbasr.data.dataset import Batch
from cbasr.models import CTCModel


def _model(stride=3):
    return build_model(
        {
            "name": "rnn",
            "hidden": 4,
            "num_layers": 1,
            "stride": stride,
            "stack": stride,
            "dropout": 0.0,
        },
        {"name": "pointwise"},
        {"name": "ctc"},
        input_dim=4,
        vocab_size=5,
    )


def test_check_utterance_counts_frames_after_subsampling_and_repeats():
    model = _model(stride=3)
    assert model.check_utterance(9, [1, 2, 3]) is None  # 3 frames for 3 labels
    assert model.check_utterance(8, [1, 2, 3]) is None  # ceil(8 / 3) = 3
    assert "cannot hold 3 labels" in model.check_utterance(6, [1, 2, 3])
    assert model.check_utterance(12, [1, 1, 2]) is None  # a blank between the repeats: 4 frames
    assert "with 1 repeats" in model.check_utterance(9, [1, 1, 2])


class _FixedDecoder(torch.nn.Module):
    def __init__(self, paths):
        super().__init__()
        self.paths = paths

    def forward(self, h, lens):
        return torch.nn.functional.one_hot(self.paths, 5).float().log_softmax(-1)


class _Identity(torch.nn.Module):
    def forward(self, x, lens):
        return x, lens


def test_greedy_decode_merges_repeats_drops_blanks_and_stops_at_length():
    paths = torch.tensor([[0, 1, 1, 0, 1, 2, 2, 3], [4, 4, 0, 4, 3, 3, 1, 1]])
    model = CTCModel(_Identity(), _FixedDecoder(paths))
    hyps = model.greedy_decode(torch.zeros(2, 8, 1), torch.tensor([8, 5]))
    assert hyps == [[1, 1, 2, 3], [4, 4, 3]]


def test_loss_matches_ctc_on_the_model_outputs():
    torch.manual_seed(0)
    model = _model()
    feats, lens = torch.randn(2, 30, 4), torch.tensor([30, 21])
    batch = Batch(
        ["a", "b"], feats, lens, torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([3, 2])
    )
    log_probs, out_lens = model.log_probs(feats, lens)
    expected = torch.nn.functional.ctc_loss(
        log_probs.transpose(0, 1), batch.targets, out_lens, batch.target_lens, reduction="none"
    )
    out = model.loss(batch.feats, batch.feat_lens, batch.targets, batch.target_lens)
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(out.nll, expected)
