"""The entry points as a user runs them: cbasr-train (a subprocess), then decode, score, results."""

import json
import shutil
import subprocess
import time

import pytest

from cbasr.cli import decode, results, score
from tests.cli.training import decode_args, train_cli, train_command


def test_a_misspelt_key_fails_at_start_with_hydras_message(tone_data, tmp_path):
    run = train_cli(tone_data, tmp_path / "exp", "encoder.hiden=3")
    assert run.returncode != 0
    assert "Key 'hiden' not in 'RNNEncoderConfig'" in run.stderr
    assert not (tmp_path / "exp").exists()
    run = train_cli(tone_data, tmp_path / "exp", "optim.lr=fast")
    assert run.returncode != 0 and "optim.lr" in run.stderr


def test_train_decode_score_results(tone_data, trained, tmp_path, capsys):
    resolved = (trained / ".hydra/config.yaml").read_text()
    assert "hidden: 24" in resolved and "max_epochs: 10" in resolved
    exp = tmp_path / "exp"  # the shared experiment is read only: decode into a copy
    shutil.copytree(trained, exp)
    args = [
        "--exp-dir",
        str(exp),
        "--manifest-dir",
        str(tone_data / "corpus"),
        "--feature-dir",
        str(tone_data / "fbank"),
        "--splits",
        "dev",
        "test",
    ]
    decode.main(args)
    stamp = (exp / "decode/dev/hyp.trn").stat().st_mtime_ns
    decode.main(args)  # up to date: skipped
    assert (exp / "decode/dev/hyp.trn").stat().st_mtime_ns == stamp
    score.main(["--exp-dir", str(exp), "--splits", "dev", "test"])
    for split in ("dev", "test"):
        s = json.loads((exp / f"decode/{split}/score.json").read_text())
        assert s["utts"] == 16 and s["skipped"] == 0 and s["error_rate"] < 20.0
        refs = (exp / f"decode/{split}/ref.trn").read_text().splitlines()
        corpus = [
            json.loads(line)
            for line in (tone_data / f"corpus/{split}.jsonl").read_text().splitlines()
        ]
        assert refs == [f"{' '.join(r['phones'])} ({r['id']})" for r in corpus]
    capsys.readouterr()
    results.main([str(exp)])
    table = capsys.readouterr().out
    assert table.count(f"| {exp.name} |") == 2 and "| dev |" in table


def test_utterances_without_features_are_counted_not_hidden(tone_data, trained, tmp_path, capsys):
    corpus = [
        json.loads(line) for line in (tone_data / "corpus/dev.jsonl").read_text().splitlines()
    ]
    corpus.append({**corpus[0], "id": "ghost", "audio": "wav/dev/ghost.wav"})
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (tmp_path / "dev").symlink_to(tone_data / "fbank/dev")
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    decode.main(
        [
            "--exp-dir",
            str(exp),
            "--manifest-dir",
            str(tmp_path),
            "--feature-dir",
            str(tmp_path),
            "--splits",
            "dev",
            "--force",
        ]
    )
    score.main(["--exp-dir", str(exp), "--splits", "dev"])
    s = json.loads((exp / "decode/dev/score.json").read_text())
    assert (s["utts"], s["failed"], s["skipped"]) == (17, 1, 0)
    assert (exp / "decode/dev/skipped.tsv").read_text().startswith("ghost\tno features")
    # the failure is a row of the score: an empty hypothesis, its reference all deletions
    assert "(ghost)" in (exp / "decode/dev/hyp.trn").read_text().splitlines()[-1]
    per_utt = {
        line.split("\t")[0]: line
        for line in (exp / "decode/dev/per_utt.tsv").read_text().splitlines()
    }
    ghost = per_utt["ghost"].split("\t")
    assert ghost[-3:] == ["0", ghost[2], "0"] and int(ghost[2]) == len(corpus[0]["phones"])
    capsys.readouterr()
    results.main([str(exp)])
    assert "| 17 | 1 |" in capsys.readouterr().out
    (exp / "decode/dev/hyp.trn").write_text("a (dev-0000)\n")
    with pytest.raises(ValueError, match="hyp.trn lacks 16 utterances"):
        score.main(["--exp-dir", str(exp), "--splits", "dev"])


def test_beam_search_lm_fusion_comparison_and_alignment(tone_data, trained, tmp_path, capsys):
    """After greedy decoding (above): beam 4 and beam 4 with an ARPA LM into their own
    directories, no worse than greedy; cbasr-compare pairs them; cbasr-align writes the CTM
    with onset errors against the tone corpus's exact starts."""
    from cbasr.cli import align, compare

    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    (tmp_path / "uniform.arpa").write_text(
        "\\data\\\nngram 1=7\n\n\\1-grams:\n-0.778 </s>\n-99 <s>\n"
        + "".join(f"-0.778 {t}\n" for t in "abcde")
        + "\n\\end\\\n"
    )
    args = [*decode_args(tone_data, exp, "dev"), "--num-threads", "1"]
    decode.main(args + ["--force"])
    decode.main(args + ["--beam", "4"])
    decode.main(
        args + ["--beam", "4", "--lm", str(tmp_path / "uniform.arpa"), "--lm-weight", "0.2"]
    )
    for tag in (None, "beam4", "beam4_lm0.2-uniform"):
        score.main(["--exp-dir", str(exp), "--splits", "dev"] + (["--tag", tag] if tag else []))
    rates = {
        d: json.loads((exp / f"decode/{d}/score.json").read_text())["error_rate"]
        for d in ("dev", "dev_beam4", "dev_beam4_lm0.2-uniform")
    }
    assert (
        rates["dev_beam4"] <= rates["dev"] + 2.0
        and rates["dev_beam4_lm0.2-uniform"] <= rates["dev"] + 5.0
    ), rates
    assert "Eval:" in (exp / "decode/dev_beam4/errors.pra").read_text()
    capsys.readouterr()
    compare.main(
        [
            str(exp),
            "--decodes",
            "dev",
            "dev_beam4",
            "dev_beam4_lm0.2-uniform",
            "--pair",
            "exp:dev",
            "exp:dev_beam4",
            "--bootstrap",
            "200",
            "--paired-bootstrap",
            "500",
        ]
    )
    table = capsys.readouterr().out
    assert "| exp:dev_beam4_lm0.2-uniform |" in table and "beam 4, lm 0.2 (uniform.arpa)" in table
    assert "| exp:dev | exp:dev_beam4 | 16 |" in table
    align.main(args[:-2])
    info = json.loads((exp / "align/dev/alignment.json").read_text())
    assert info["method"] == "ctc_forced_align" and info["utts"] == 16
    assert info["mean_abs_onset_error_ms"] < 60.0, info


def test_each_checkpoint_and_lm_decodes_into_its_own_labelled_directory(
    tone_data, trained, tmp_path, capsys
):
    """Decodings that differ in what changes the result never share a directory; a re-decoding
    removes the old score, and a score that does not match its hyp.trn is refused."""
    from cbasr.cli import compare, results

    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    args = [*decode_args(tone_data, exp, "dev"), "--num-threads", "1"]
    decode.main(args + ["--force"])
    decode.main(args + ["--checkpoint", "epoch-6"])
    for tag in (None, "epoch-6"):
        score.main(["--exp-dir", str(exp), "--splits", "dev"] + (["--tag", tag] if tag else []))
    epochs = {
        d: json.loads((exp / f"decode/{d}/decode.json").read_text())["epoch"]
        for d in ("dev", "dev_epoch-6")
    }
    assert epochs["dev_epoch-6"] == 6 and epochs["dev"] >= 1
    capsys.readouterr()
    compare.main([str(exp), "--decodes", "dev", "dev_epoch-6", "--bootstrap", "50"])
    table = capsys.readouterr().out
    assert "| exp:dev |" in table and "| exp:dev_epoch-6 |" in table
    decode.main(args + ["--force"])  # a new decoding into dev/: its old score is gone
    assert not (exp / "decode/dev/score.json").exists()
    hyp = exp / "decode/dev_epoch-6/hyp.trn"  # a hypothesis file changed after scoring
    hyp.write_text(hyp.read_text().replace(" a ", " b ", 1))
    capsys.readouterr()
    for command in (
        lambda: compare.main([str(exp), "--decodes", "dev_epoch-6", "--bootstrap", "50"]),
        lambda: results.main([str(exp)]),
    ):
        with pytest.raises(SystemExit) as exit_:
            command()
        assert exit_.value.code != 0
        assert "computed from another hyp.trn" in capsys.readouterr().err


def test_a_second_start_on_a_running_experiment_is_refused_and_the_first_finishes(
    tone_data, tmp_path
):
    from cbasr.storage.checkpoint import load_checkpoint

    exp = tmp_path / "exp"
    cmd = train_command(tone_data, exp, "trainer.max_epochs=3")
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (exp / "config.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)  # the first run holds the lock once it has written config.json
    config = (exp / "config.json").read_bytes()
    second = train_cli(tone_data, exp, "trainer.max_epochs=5")
    assert second.returncode == 1
    assert f"{exp} is in use by another run (pid {first.pid} on " in second.stderr
    assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    assert (exp / "config.json").read_bytes() == config  # the refused run wrote nothing
    assert load_checkpoint(exp / "checkpoints/best.pt")["state"]["epoch"] >= 1
    assert json.loads((exp / "history.json").read_text())[-1]["epoch"] == 3


def test_a_sweep_trains_each_combination_in_its_own_directory(tone_data, tmp_path):
    sweep = tmp_path / "sweep"
    run = train_cli(
        tone_data,
        sweep,
        "-m",
        "encoder.hidden=8,12",
        "trainer.max_epochs=1",
        "trainer.num_threads=1",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for hidden in (8, 12):
        exp = sweep / f"encoder.hidden={hidden}"
        config = json.loads((exp / "config.json").read_text())
        assert config["encoder"]["hidden"] == hidden and config["exp_dir"] == str(exp)
        assert (exp / "checkpoints/best.pt").is_file() and (exp / ".hydra/config.yaml").is_file()
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [
        "encoder.hidden=12",
        "encoder.hidden=8",
    ]
