"""Progress bars: on a terminal only, so logs and pipes stay clean."""

import shutil
import sys

from cbasr.cli import decode
from cbasr.progress import byte_bar, counter_bar, progress_bar
from tests.cli.training import decode_args


def test_a_bar_only_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert list(progress_bar(range(3), "counting")) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert list(progress_bar(range(3), "counting")) == [0, 1, 2]
    assert "counting" in capsys.readouterr().err


def test_counted_bars_resume_where_they_were_and_can_be_turned_off(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with counter_bar("epoch 2", 10, initial=4, unit="batch") as bar:
        bar.update()
    assert "4/10" in capsys.readouterr().err  # a resumed epoch counts on from its batch
    with counter_bar("epoch 2", 10, enabled=False) as bar:  # trainer.progress_bar=false
        bar.update()
    assert capsys.readouterr().err == ""
    with byte_bar("a.tar.gz", 4 * 2**20) as bar:
        bar.update(2**21)
    assert "/4.00M" in capsys.readouterr().err  # bytes, scaled
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with counter_bar("epoch 2", 10) as bar:
        bar.update()
    assert capsys.readouterr().err == ""


def test_decoding_shows_its_bar_on_a_terminal(tone_data, trained, tmp_path, monkeypatch, capfd):
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    args = [*decode_args(tone_data, exp, "test"), "--force"]
    decode.main(args)
    assert "decoding test" not in capfd.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    decode.main(args)
    assert "decoding test" in capfd.readouterr().err
