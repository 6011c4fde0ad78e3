"""Progress bars: on a terminal only, so logs and pipes stay clean."""

import shutil
import sys

from cbasr.cli import decode
from cbasr.progress import progress_bar
from tests.cli.training import decode_args


def test_a_bar_only_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert list(progress_bar(range(3), "counting")) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert list(progress_bar(range(3), "counting")) == [0, 1, 2]
    assert "counting" in capsys.readouterr().err


def test_decoding_shows_its_bar_on_a_terminal(tone_data, trained, tmp_path, monkeypatch, capfd):
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    args = [*decode_args(tone_data, exp, "test"), "--force"]
    decode.main(args)
    assert "decoding test" not in capfd.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    decode.main(args)
    assert "decoding test" in capfd.readouterr().err
