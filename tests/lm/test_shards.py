"""Token-id shards of LM text: the same sentences as reading it whole, built once, rebuilt when
anything they depend on changes; epochs that visit every sentence once, shuffled by shard and
within a shard, and resume by slicing."""

import json
import pickle

import numpy as np
import pytest

from cbasr.data.vocab import Vocabulary
from cbasr.lm.corpus import read_sentences
from cbasr.lm.neural import token_batches
from cbasr.lm.shards import EpochPlan, build_shards, length_batches, sentences_of

WORDS = ["a", "b", "c", "d", "e"]


@pytest.fixture
def text(tmp_path):
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=rng.integers(1, 9))) for _ in range(200)]
    lines[17] = "a zz b"  # unknown token
    lines[40] = ""  # blank line: not a sentence
    path = tmp_path / "lm.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def vocab():
    return Vocabulary(WORDS)


def _all(text):
    return [s for shard in range(len(text.shards)) for s in text.load(shard)]


def test_shards_hold_the_sentences_of_the_whole_text_in_order(tmp_path, text, vocab):
    whole, skipped = read_sentences(text, vocab, "words")
    sharded = build_shards(text, vocab, "words", tmp_path / "shards", shard_tokens=50)
    assert len(sharded.shards) > 5 and all(s["tokens"] >= 50 for s in sharded.shards[:-1])
    assert len(sharded) == len(whole) == 198 and sharded.tokens == len(whole.ids)
    assert all(np.array_equal(a, b) for a, b in zip(_all(sharded), whole))
    assert sharded.skipped == 1 and skipped == [f"{text}:18\ttoken 'zz' not in the vocabulary"]
    assert (tmp_path / "shards/skipped.tsv").read_text() == skipped[0] + "\n"


def test_shards_are_reused_and_rebuilt_when_what_they_depend_on_changes(
    tmp_path, text, vocab, caplog
):
    directory = tmp_path / "shards"
    build_shards(text, vocab, "words", directory, shard_tokens=50)
    stamp = (directory / "shard-00000.ids.npy").stat().st_mtime_ns
    build_shards(text, vocab, "words", directory, shard_tokens=50)
    assert (directory / "shard-00000.ids.npy").stat().st_mtime_ns == stamp  # reused
    caplog.set_level("INFO")
    rebuilt = build_shards(text, vocab, "words", directory, shard_tokens=80)
    assert "building again" in caplog.text and rebuilt.index["params"]["shard_tokens"] == 80
    assert not (directory / f"shard-{len(rebuilt.shards):05d}.ids.npy").exists()  # old ones gone
    with open(text, "a") as f:
        f.write("e e e\n")
    assert len(build_shards(text, vocab, "words", directory, shard_tokens=80)) == 199
    assert len(build_shards(text, Vocabulary(WORDS + ["zz"]), "words", directory, 80)) == 200
    (directory / "index.json").unlink()  # an interrupted build: no index
    assert len(build_shards(text, vocab, "words", directory, 80)) == 199
    with pytest.raises(FileNotFoundError, match="missing.txt: LM text not found"):
        build_shards(tmp_path / "missing.txt", vocab, "words", directory)


def test_shards_of_no_tokens_are_refused(tmp_path, text, vocab):
    """A direct caller's ``shard_tokens`` (not the ``data`` group's) is checked as the schema's."""
    with pytest.raises(ValueError, match="shard_tokens must be > 0, got 0"):
        build_shards(text, vocab, "words", tmp_path / "shards", shard_tokens=0)
    assert not (tmp_path / "shards").exists()
    assert len(build_shards(text, vocab, "words", tmp_path / "one", shard_tokens=1).shards) == 198


def test_an_epoch_visits_every_sentence_once_in_batches_within_the_budget(tmp_path, text, vocab):
    sharded = build_shards(text, vocab, "words", tmp_path / "shards", shard_tokens=50)
    counts = sharded.batch_counts(max_tokens=20)
    plan = EpochPlan(sharded, 20, seed=3, counts=counts)
    batches = list(plan)
    assert len(batches) == len(plan) == sum(counts)
    seen = sorted((b.shard, i) for b in batches for i in b.indices)
    assert seen == [
        (s, i) for s, info in enumerate(sharded.shards) for i in range(info["sentences"])
    ]
    for batch, sentences in zip(batches, sentences_of(sharded, batches)):
        assert batch.tokens == sum(len(s) + 1 for s in sentences)
        assert len(sentences) == 1 or max(len(s) + 1 for s in sentences) * len(sentences) <= 20
    shard_runs = [
        b.shard for i, b in enumerate(batches) if i == 0 or batches[i - 1].shard != b.shard
    ]
    assert sorted(shard_runs) == list(range(len(sharded.shards)))  # one shard after another
    assert shard_runs != sorted(shard_runs)  # in a drawn order
    assert [b.indices for b in batches] == [b.indices for b in EpochPlan(sharded, 20, 3, counts)]
    assert [b.indices for b in batches] != [b.indices for b in EpochPlan(sharded, 20, 4, counts)]


def test_a_sliced_plan_continues_with_the_same_batches(tmp_path, text, vocab):
    sharded = build_shards(text, vocab, "words", tmp_path / "shards", shard_tokens=50)
    counts = sharded.batch_counts(max_tokens=20)
    plan = EpochPlan(sharded, 20, seed=7, counts=counts)
    batches = list(plan)
    for k in (0, 1, counts[plan.order[0]], counts[plan.order[0]] + 2, len(batches) - 1):
        assert list(plan[k:]) == batches[k:] and len(plan[k:]) == len(batches) - k
    assert plan[5] == batches[5] and list(plan[len(batches) :]) == []
    with pytest.raises(TypeError):
        plan[2:5]


def test_length_batches_by_hand():
    lengths = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5])
    # by length, ties in order; padded to the longest + 1 (the end), at most 8 tokens a batch
    expected = [[1, 3], [6, 0], [9], [2], [4], [8], [10], [7], [5]]
    assert length_batches(lengths, 8) == expected
    shuffled = length_batches(lengths, 8, seed=1)
    assert shuffled != expected and sorted(shuffled) == sorted(expected)
    assert shuffled == length_batches(lengths, 8, seed=1)
    assert token_batches([[1] * n for n in lengths], 8) == expected


def test_the_lm_task_reports_the_training_texts_skips(tmp_path, text, vocab):
    from cbasr.config import typed
    from cbasr.config.lm_schema import TrainLMConfig
    from cbasr.training.lm_task import LmTask

    vocab.save(tmp_path / "vocab.txt")
    dev = tmp_path / "dev.txt"
    dev.write_text("a b\nq\n")
    plain = {
        "exp_dir": str(tmp_path / "exp"),
        "lm": {"name": "lstm", "embed_dim": 4, "hidden": 4, "num_layers": 1, "dropout": 0.0},
        "data": {
            "train": str(text),
            "valid": str(dev),
            "vocab": str(tmp_path / "vocab.txt"),
            "units": "words",
            "max_tokens": 20,
            "shard_tokens": 50,
        },
        "trainer": {"seed": 1},
    }
    task = LmTask(typed(TrainLMConfig, plain, ""), tmp_path / "exp")
    task.prepare(tmp_path / "exp")
    skipped = (tmp_path / "exp/skipped.tsv").read_text().splitlines()
    assert skipped == [
        f"{text}:18\ttoken 'zz' not in the vocabulary",
        f"{dev}:2\ttoken 'q' not in the vocabulary",
    ]
    assert json.loads((tmp_path / "exp/shards/index.json").read_text())["skipped"] == 1


def test_the_walks_of_an_epoch_draw_each_shard_once(tmp_path, text, vocab, monkeypatch):
    """The trainer walks the plan beside its loader, which walks it beside the sentences: three
    walks side by side, each shard's batches drawn once (a slice, a resumed epoch, too)."""
    from cbasr.lm import shards

    sharded = build_shards(text, vocab, "words", tmp_path / "shards", shard_tokens=50)
    counts = sharded.batch_counts(max_tokens=20)
    drawn = []
    draw = shards.length_batches

    def counting(lengths, max_tokens, seed):
        drawn.append(seed)
        return draw(lengths, max_tokens, seed=seed)

    monkeypatch.setattr(shards, "length_batches", counting)
    for start in (0, 3):
        drawn.clear()
        plan = EpochPlan(sharded, 20, seed=3, counts=counts)[start:]
        loader = zip(plan, sentences_of(sharded, plan))
        walked = [(b, own) for (b, _), own in zip(loader, plan)]
        assert len(walked) == sum(counts) - start and all(a == b for a, b in walked)
        assert len(drawn) == len(set(drawn)) == len(counts)
    copy = pickle.loads(pickle.dumps(plan))  # (a loader's worker process gets one)
    assert list(copy) == list(plan)
