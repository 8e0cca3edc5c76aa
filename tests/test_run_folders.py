"""One run, one folder: whatever the loggers and the commands after `fit`, the run's checkpoints stay where
``--ckpt_path last|best`` finds them, and validate/test/predict on them write beside the run, never a new run."""

import json
from pathlib import Path

import pytest
from conftest import TINY, residual_without_diagnostics, residual_without_diagnostics_text
from test_cli import run_main

TINY_FIT = [
    *TINY, "--data.eval_train", "false", "--data.eval_batch_size", "8", "--trainer.max_epochs", "1",
    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
RUN = ["--config", residual_without_diagnostics(), *TINY_FIT]
READ = ["--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1"]


def versions(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("version_"))


def test_validate_on_last_writes_beside_the_run_and_last_stays_the_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(capsys, "fit", *RUN)
    assert code == 0, err[-3000:]
    for subcommand in ("validate", "test", "validate"):
        code, _, err = run_main(capsys, subcommand, *RUN, *READ, "--ckpt_path", "last")
        assert code == 0, err[-3000:]
    runs = tmp_path / "lightning_logs" / "residual"
    assert versions(runs) == ["version_0"]
    assert list((runs / "version_0" / "validate" / "last").glob("events.out.tfevents.*"))


def tensorboard_and_csv(folder: Path, csv_name: str) -> str:
    tensorboard = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                   "init_args": {"save_dir": str(folder), "name": "residual"}}
    csv = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(folder),
                                                                             "name": csv_name}}  # fmt: skip
    return json.dumps([tensorboard, csv])


def test_with_a_list_of_loggers_validate_test_and_predict_write_beside_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loggers = ["--trainer.logger", tensorboard_and_csv(tmp_path, "csv")]  # each logger in a folder of its own
    code, _, err = run_main(capsys, "fit", *RUN, *loggers)
    assert code == 0, err[-3000:]
    prompts = ["--data.prompts", '["It was"]', "--model.max_new_tokens", "2"]
    for subcommand, more in (("validate", []), ("test", []), ("predict", prompts), ("test", [])):
        code, _, err = run_main(capsys, subcommand, *RUN, *loggers, *READ, *more, "--ckpt_path", "last")
        assert code == 0, (subcommand, err[-3000:])
    run = tmp_path / "residual" / "version_0"
    assert versions(tmp_path / "residual") == ["version_0"] and versions(tmp_path / "csv") == ["version_0"]
    assert (run / "test" / "last" / "metrics.csv").is_file() and list((run / "test" / "last").glob("events.*"))
    assert (run / "predict" / "last" / "continuations.txt").is_file()


# `~` by default; a file:// URL and a ModelCheckpoint's own `~` folder go through the same rule: the `full` tier
@pytest.mark.parametrize("where", ["~", *(pytest.param(w, marks=pytest.mark.full) for w in ["file://", "dirpath ~"])])
def test_a_home_or_file_url_folder_holds_the_whole_run_and_ckpt_path_last_finds_it(where, tmp_path, capsys,
                                                                                    monkeypatch):
    """``~/runs`` or ``file://<folder>/runs`` as the logger's save_dir (or ``~/ckpts`` as the ModelCheckpoint's
    dirpath): the events and the checkpoints in that folder, nothing in the working folder named ``~`` or ``file:``,
    and ``--ckpt_path last`` with the same settings reads them."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    config = work / "residual.yaml"
    text = residual_without_diagnostics_text()
    if where == "dirpath ~":
        dirpath = "auto_insert_metric_name: false\n        dirpath: ~/ckpts"
        text = text.replace("auto_insert_metric_name: false", dirpath)
    config.write_text(text)
    save_dir = {"~": "~/runs", "file://": f"file://{home}/runs", "dirpath ~": "~/runs"}[where]
    args = ["--config", str(config), *TINY_FIT, "--trainer.logger.init_args.save_dir", save_dir]
    code, _, err = run_main(capsys, "fit", *args)
    assert code == 0, err[-3000:]
    run = home / "runs" / "residual" / "version_0"
    assert list(run.glob("events.out.tfevents.*"))
    checkpoints = home / "ckpts" if where == "dirpath ~" else run / "checkpoints"
    assert (checkpoints / "last.ckpt").is_file() and list(checkpoints.glob("best-epoch*.ckpt"))
    assert [p.name for p in work.iterdir()] == ["residual.yaml"]
    for which in ("last", "best"):
        code, _, err = run_main(capsys, "test", *args, *READ, "--ckpt_path", which)
        assert code == 0, err[-3000:]
    assert [p.name for p in work.iterdir()] == ["residual.yaml"]
    if where != "dirpath ~":  # (a checkpoint outside its run's folder is tested as a run of its own)
        assert versions(run.parent) == ["version_0"]


def test_two_loggers_of_one_folder_write_one_run_folder_that_ckpt_path_last_finds(tmp_path, capsys, monkeypatch):
    """A TensorBoard and a CSV logger with the same save_dir and name: each run is one ``version_N`` holding both
    loggers' files and the checkpoints (Lightning alone gives each logger its own version, 0 and 1)."""
    monkeypatch.chdir(tmp_path)
    loggers = ["--trainer.logger", tensorboard_and_csv(tmp_path, "residual")]
    code, _, err = run_main(capsys, "fit", *RUN, *loggers)
    assert code == 0, err[-3000:]
    code, _, err = run_main(capsys, "fit", "--config", str(tmp_path / "residual" / "version_0" / "config.yaml"))
    assert code == 0, err[-3000:]  # the run's settings again: a new run
    assert versions(tmp_path / "residual") == ["version_0", "version_1"]
    for run in (tmp_path / "residual" / "version_0", tmp_path / "residual" / "version_1"):
        assert list(run.glob("events.out.tfevents.*")) and (run / "metrics.csv").is_file()
        assert (run / "checkpoints" / "last.ckpt").is_file()
    for which in ("last", "best"):
        code, _, err = run_main(capsys, "test", *RUN, *loggers, *READ, "--ckpt_path", which)
        assert code == 0, err[-3000:]
    assert versions(tmp_path / "residual") == ["version_0", "version_1"]
    assert (tmp_path / "residual" / "version_1" / "test" / "last" / "metrics.csv").is_file()
