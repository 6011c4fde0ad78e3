"""scripts/bench_lm_text.py: the generated LM text it measures."""

from tests.scripts import load_script


def _bench_lm_text():
    return load_script("bench_lm_text")


def test_the_text_has_the_words_it_says_in_lines_of_5_to_35(tmp_path):
    bench = _bench_lm_text()
    for seed in range(4):
        written = bench.write_text(tmp_path / "lm.txt", 1000, vocab_size=50, seed=seed)
        lines = (tmp_path / "lm.txt").read_text().splitlines()
        lengths = [len(line.split()) for line in lines]
        assert written >= 1000 and sum(lengths) == written
        assert min(lengths) >= 5 and max(lengths) <= 35, seed
        words = {w for line in lines for w in line.split()}
        assert words <= {f"w{i}" for i in range(50)} and len(words) > 40
    again = bench.write_text(tmp_path / "again.txt", 1000, vocab_size=50, seed=3)
    assert again == written and (tmp_path / "again.txt").read_text() == "\n".join(lines) + "\n"
