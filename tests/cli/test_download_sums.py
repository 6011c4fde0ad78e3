"""cbasr-download --sums: sha256sum / md5sum output, read line by line."""

import pytest

from cbasr.cli.download import read_sums


def test_sums_files_read_blank_lines_binary_marks_paths_and_either_digest(tmp_path):
    sha, md5 = "AB" * 32, "cd" * 16
    (tmp_path / "sums.txt").write_text(
        f"\n{sha}  *dir/dev-clean-2.tar.gz\n   \n{md5}  train-clean-5.tar.gz\n"
    )
    assert read_sums(tmp_path / "sums.txt") == {
        "dev-clean-2.tar.gz": "ab" * 32,
        "train-clean-5.tar.gz": md5,
    }


@pytest.mark.parametrize(
    "bad",
    [
        "xyz  a.tar.gz",
        "ab" * 20 + "  a.tar.gz",  # neither MD5's 32 digits nor SHA-256's 64
        "zz" + "ab" * 31 + "  a.tar.gz",  # 64 characters, not all hexadecimal
        "ab" * 32,
        "ab" * 32 + "  a b.tar.gz",
    ],
)
def test_a_malformed_sums_line_is_named_by_its_line(tmp_path, bad):
    (tmp_path / "sums.txt").write_text(f"{'ab' * 32}  a.tar.gz\n\n{bad}\n")
    with pytest.raises(SystemExit, match=r"sums\.txt:3: expected '<md5 or sha256>  <file>'"):
        read_sums(tmp_path / "sums.txt")
