"""The LSTM token LM: step-by-step scores equal the teacher-forced ones, the sequence score is
the sum of its tokens' and the end of sentence's, padding changes nothing."""

import pytest
import torch

from cbasr.modules.language_model import BOUNDARY, LSTMLanguageModel


@pytest.fixture
def lm():
    torch.manual_seed(0)
    return LSTMLanguageModel(6, embed_dim=4, hidden=5, num_layers=2, dropout=0.0).eval()


def test_step_by_step_equals_teacher_forced(lm):
    targets = torch.tensor([[3, 1, 5, 2]])
    teacher = lm(targets)[0]  # (U + 1, V)
    log_probs, state = lm.step(torch.tensor([BOUNDARY]))
    for u in range(targets.shape[1] + 1):
        torch.testing.assert_close(log_probs[0], teacher[u])
        if u < targets.shape[1]:
            log_probs, state = lm.step(targets[:, u], state)


def test_sequence_score_sums_tokens_and_the_end_of_sentence(lm):
    targets = torch.tensor([[3, 1, 5, 2], [4, 4, 1, 1]])  # the second has 2 labels and padding
    lens = torch.tensor([4, 2])
    scores = lm.sequence_log_probs(targets, lens)
    for b, n in enumerate(lens.tolist()):
        rows = lm(targets[b : b + 1, :n])[0]
        by_hand = sum(rows[u, targets[b, u]] for u in range(n)) + rows[n, BOUNDARY]
        torch.testing.assert_close(scores[b], by_hand)
    empty = lm.sequence_log_probs(torch.ones(1, 3, dtype=torch.long), torch.tensor([0]))
    torch.testing.assert_close(empty[0], lm(torch.ones(1, 0, dtype=torch.long))[0, 0, BOUNDARY])


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="vocab_size must be >= 2"):
        LSTMLanguageModel(1)
