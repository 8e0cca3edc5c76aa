"""`validate`/`test`/`predict`/`export --ckpt_path` without `--config`: the checkpoint's run's own settings."""

import re
import warnings

import pytest
import yaml
from test_cli import run_main


def test_test_after_a_fit_with_overrides_needs_no_config(tiny_run, capsys, monkeypatch):
    """The tiny run overrode residual.yaml's sizes (2 blocks of 32, not 4 of 256): `test --ckpt_path last` alone
    evaluates that model, and Lightning says nothing about the checkpoint's callbacks that test does not use."""
    monkeypatch.chdir(tiny_run.root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # past pyproject's filter of Lightning's UserWarnings
        code, out, err = run_main(capsys, "test", "--ckpt_path", "last")
    assert code == 0, err[-3000:]
    loss = float(re.search(r"test/loss\s*[│|]\s*([\d.]+)", out).group(1))
    assert loss == pytest.approx(tiny_run.last_val, abs=1e-4)  # the trained 2-block model's validation loss
    said = [str(w.message) for w in caught] + [err]
    assert not [m for m in said if "callbacks used to create the checkpoint" in m], said


def test_ckpt_path_best_of_a_run_by_path_without_config(tiny_run, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # another folder: the path alone finds the run
    ckpt = tiny_run.version / "checkpoints" / "best-epoch01.ckpt"
    code, out, err = run_main(capsys, "validate", "--ckpt_path", str(ckpt), "--trainer.limit_val_batches", "1")
    assert code == 0, err[-3000:]
    assert re.search(r"loss/val\s*[│|]\s*([\d.]+)", out)


def test_runs_of_several_configs_are_one_error_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("no_residual", "residual"):
        (tmp_path / "lightning_logs" / name / "version_0" / "checkpoints").mkdir(parents=True)
    code, _, err = run_main(capsys, "test", "--ckpt_path", "last")
    assert code == 2 and err.count("\n") == 1
    assert err == (
        "error: --ckpt_path last without --config: lightning_logs holds the runs of 2 configs (no_residual, "
        "residual); say whose with --config (e.g. --config no_residual) or give a checkpoint's path\n"
    )


def test_a_config_that_disagrees_still_says_so(tiny_run, capsys, monkeypatch):
    monkeypatch.chdir(tiny_run.root)
    code, _, err = run_main(capsys, "test", "--config", "residual", "--ckpt_path", "last")
    assert code == 2 and err.count("\n") == 1
    assert "is of a different architecture than the config: model.config.emb_dim is 32 in the checkpoint" in err


def test_the_runs_config_is_under_every_option_given_before_or_after_ckpt_path(tiny_run, capsys, monkeypatch):
    """As a --config given first: the run's config.yaml, then each option over it, wherever it stands; --print_config
    shows the result, with the checkpoint `last` found."""
    monkeypatch.chdir(tiny_run.root)
    args = ["--data.eval_batch_size", "3", "--ckpt_path", "last", "--model.lr", "0.5", "--print_config"]
    code, out, err = run_main(capsys, "test", *args)
    assert code == 0, err[-3000:]
    config = yaml.safe_load(out)
    assert config["model"]["config"]["emb_dim"] == 32  # the run's (its residual.yaml says 256)
    assert (config["data"]["eval_batch_size"], config["model"]["lr"]) == (3, 0.5)
    assert config["ckpt_path"] == str(tiny_run.version.relative_to(tiny_run.root) / "checkpoints" / "last.ckpt")


def test_ckpt_path_last_without_config_looks_under_a_home_default_root_dir(tiny_run, capsys, monkeypatch, tmp_path):
    """`--trainer.default_root_dir '~/'` (quoted: the shell leaves it) is the home folder, as for the run's files."""
    monkeypatch.setenv("HOME", str(tiny_run.root))
    monkeypatch.chdir(tmp_path)
    args = ["--trainer.default_root_dir", "~/", "--ckpt_path", "last", "--print_config"]
    code, out, err = run_main(capsys, "test", *args)
    assert code == 0, err[-3000:]
    config = yaml.safe_load(out)
    assert config["model"]["config"]["emb_dim"] == 32  # the run's own config
    assert config["ckpt_path"] == str(tiny_run.version / "checkpoints" / "last.ckpt")


def test_a_bad_value_in_the_runs_config_yaml_is_named_with_that_file_and_line(tiny_run, capsys, tmp_path):
    """validate on a run's checkpoint reads the run's config.yaml: a value there that cannot be used is the file's,
    named with its line, not the command line's."""
    run = tmp_path / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").symlink_to(tiny_run.version / "checkpoints" / "last.ckpt")
    lines = (tiny_run.version / "config.yaml").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("lr:"))
    lines[at] = lines[at].split("lr:")[0] + "lr: fast"
    (run / "config.yaml").write_text("\n".join(lines) + "\n")
    code, out, err = run_main(capsys, "validate", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"))
    assert code == 2
    assert err.startswith("error: model.lr: expected float, got 'fast'") and err.count("\n") == 1, err
    assert f"in {run / 'config.yaml'}, line {at + 1}" in err, err
