"""cbasr.search.prefix.select: the best candidates, and a stable choice among equal scores."""

import torch

from cbasr.search.prefix import select

NEG_INF = float("-inf")


def test_select_keeps_the_best_and_pads_with_dead_candidates():
    total = torch.tensor([[0.5, NEG_INF, 2.0, 1.0], [NEG_INF, -1.0, NEG_INF, NEG_INF]])
    values, index, width = select(total, 3)
    assert width == 3
    assert index[0].tolist() == [2, 3, 0] and values[0].tolist() == [2.0, 1.0, 0.5]
    assert index[1, 0] == 1 and torch.isinf(values[1, 1:]).all()
    values, index, width = select(total, None)  # every finite one of the fullest utterance
    assert width == 3 and values[0].tolist() == [2.0, 1.0, 0.5]
    assert select(total, 9)[2] == 4  # at most the candidates there are


def test_a_stable_selection_keeps_the_first_of_equal_scores():
    """Equal scores (a context-1 prediction network gives reordered label pairs the same
    probability) go to the earlier candidate, wherever the padding puts the later ones."""
    for width in (5, 300):
        total = torch.full((2, width), NEG_INF)
        total[0, [1, 3, 4]] = 1.0
        total[1, [0, width - 1]] = torch.tensor([0.25, 3.0])
        total[1, 2] = 0.25
        values, index, _ = select(total, 2, stable=True)
        assert index.tolist() == [[1, 3], [width - 1, 0]]
        assert values.tolist() == [[1.0, 1.0], [3.0, 0.25]]
