"""What `fit` leaves in checkpoints/, and how it is written: last.ckpt is always the newest exact state, whatever
checkpoint callbacks the config lists; a save that fails leaves the previous file whole; ``--ckpt_path last|best``.

Stopping and resuming (Ctrl-C, SIGTERM, kill -9, a full disk) at every moment: test_fault_matrix.py. The runs
here use residual.yaml without its diagnostics (``residual_without_diagnostics_text``): none is read.
"""

import contextlib
import json
import os
import re
import resource
import signal
from pathlib import Path

import pytest
import torch
from conftest import TINY, residual_without_diagnostics, residual_without_diagnostics_text
from jsonargparse import Namespace

from gpt_lit.errors import GptLitError
from gpt_lit.run.checkpoints import AtomicCheckpointIO, NoRoomError
from gpt_lit.run.cli import main
from gpt_lit.run.folders import latest_checkpoint, runs_folder

RUN = [
    *TINY, "--data.eval_train", "false", "--data.eval_batch_size", "8",
    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


def loops(path: Path) -> tuple[int, int]:
    """(global step, epochs whose end hooks ran) of a checkpoint."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return ckpt["global_step"], ckpt["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"]


def test_last_is_the_final_state_whatever_model_checkpoints_the_config_lists(tmp_path):
    # The shipped ModelCheckpoint with mode max and save_last (its best is epoch 0, the highest validation loss),
    # and beside it one saving every step (monitor loss/train_step, top 2, save_last): Lightning alone would
    # leave last.ckpt at step 2 or before the last epoch's evaluation; and with last-v1.ckpt beside it.
    config = tmp_path / "mine.yaml"
    shipped = residual_without_diagnostics_text().replace("mode: min", "mode: max")
    save_last = "auto_insert_metric_name: false\n        save_last: true"
    config.write_text(shipped.replace("auto_insert_metric_name: false", save_last))
    every_step = {"every_n_train_steps": 1, "save_top_k": 2, "monitor": "loss/train_step", "save_last": True,
                  "filename": "step{step}"}  # fmt: skip
    every_step = json.dumps({"class_path": "ModelCheckpoint", "init_args": every_step})
    main(["fit", "--config", str(config), *RUN, "--trainer.max_epochs", "3", "--trainer.logger.init_args.save_dir",
          str(tmp_path), f"--trainer.callbacks+={every_step}"])  # fmt: skip
    ckpts = tmp_path / "residual" / "version_0" / "checkpoints"
    names = sorted(p.name for p in ckpts.iterdir())
    assert "last.ckpt" in names and "best-epoch00.ckpt" in names and not [n for n in names if "last-v" in n], names
    assert len([n for n in names if n.startswith("step")]) == 2
    assert loops(ckpts / "last.ckpt") == (6, 3)  # all 3 x 2 steps, and the last epoch's end
    assert loops(ckpts / "best-epoch00.ckpt")[0] == 2
    # --ckpt_path last is last.ckpt (the newest run: version_0 only here); best is ambiguous with two monitors
    assert latest_checkpoint(tmp_path / "residual", "last") == str(ckpts / "last.ckpt")
    with pytest.raises(GptLitError) as ambiguous:
        latest_checkpoint(tmp_path / "residual", "best")
    message = str(ambiguous.value)
    assert "has 2 ModelCheckpoints with a monitor" in message and "give the one you want as --ckpt_path" in message
    assert str(ckpts / "best-epoch00.ckpt") in message and str(ckpts / "stepstep=6.ckpt") in message


def test_a_config_without_a_model_checkpoint_still_saves_last(tmp_path):
    text = residual_without_diagnostics_text()
    config = tmp_path / "mine.yaml"
    config.write_text(text[: text.index("    - class_path: lightning.pytorch.callbacks.ModelCheckpoint")])
    main(["fit", "--config", str(config), *RUN, "--trainer.max_epochs", "1",
          "--trainer.logger.init_args.save_dir", str(tmp_path)])  # fmt: skip
    ckpts = tmp_path / "residual" / "version_0" / "checkpoints"
    assert [p.name for p in ckpts.iterdir()] == ["last.ckpt"]
    assert loops(ckpts / "last.ckpt") == (2, 1)


def test_ckpt_path_best_is_the_file_of_the_model_checkpoint_with_a_monitor(tmp_path):
    # A periodic ModelCheckpoint without a monitor (every epoch, all kept), listed before the shipped best-epoch one:
    # its files are the newest, and its state has a best_model_path too (the newest file it saved).
    periodic = {"class_path": "ModelCheckpoint", "init_args": {"every_n_epochs": 1, "save_top_k": -1}}
    text = residual_without_diagnostics_text()
    at = text.index("    - class_path: lightning.pytorch.callbacks.ModelCheckpoint")
    config = tmp_path / "mine.yaml"
    config.write_text(text[:at] + f"    - {json.dumps(periodic)}\n" + text[at:])
    args = ["--config", str(config), *RUN, "--trainer.logger.init_args.save_dir", str(tmp_path)]
    fit = main(["fit", *args, "--trainer.max_epochs", "2", "--model.lr", "0.05"])
    [monitored] = [cb for cb in fit.trainer.checkpoint_callbacks if getattr(cb, "monitor", None)]
    validate = main(["validate", *args, "--ckpt_path", "best"])
    assert validate.trainer.ckpt_path == monitored.best_model_path
    loss = validate.trainer.callback_metrics["loss/val"].item()
    assert loss == pytest.approx(monitored.best_model_score.item(), abs=1e-5)


def test_last_lies_beside_the_runs_other_checkpoints_wherever_they_go(tmp_path):
    # TensorBoard's sub_dir moves its events, not Lightning's checkpoints folder.
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.limit_train_batches", "1"]
    main(["fit", "--config", residual_without_diagnostics(), *RUN, *logs, "--trainer.max_epochs", "1",
          "--trainer.logger.init_args.sub_dir", "events"])  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "residual/version_0/checkpoints").iterdir()) == [
        "best-epoch00.ckpt", "last.ckpt"]  # fmt: skip
    # The ModelCheckpoint's own dirpath.
    elsewhere = tmp_path / "elsewhere"
    config = tmp_path / "mine.yaml"
    shipped = residual_without_diagnostics_text()
    config.write_text(shipped.replace("mode: min", f"mode: min\n        dirpath: {elsewhere}"))
    main(["fit", "--config", str(config), *RUN, *logs, "--trainer.max_epochs", "1"])
    assert sorted(p.name for p in elsewhere.iterdir()) == ["best-epoch00.ckpt", "last.ckpt"]
    assert not (tmp_path / "residual/version_1/checkpoints").exists()
    for which in ("last", "best"):  # and --ckpt_path last|best find them there
        tested = main(["test", "--config", str(config), *RUN, *logs, "--ckpt_path", which])
        assert tested.trainer.ckpt_path == str(elsewhere / ("last.ckpt" if which == "last" else "best-epoch00.ckpt"))


NO_FOLDER_LOGGER = """
from lightning.pytorch.loggers import Logger

class NoFolder(Logger):
    \"\"\"A logger with no folder of its own (as W&B's or MLflow's): a save_dir, a name, a version per run.\"\"\"
    def __init__(self, save_dir: str, version: str):
        super().__init__()
        self._save_dir, self._version = save_dir, version
    name = property(lambda self: "runs")
    version = property(lambda self: self._version)
    save_dir = property(lambda self: self._save_dir)
    def log_metrics(self, metrics, step=None):
        pass
    def log_hyperparams(self, params, *args, **kwargs):
        pass
"""


def test_a_logger_without_a_folder_of_its_own_gives_each_run_its_last_checkpoint(tmp_path, monkeypatch):
    (tmp_path / "no_folder.py").write_text(NO_FOLDER_LOGGER)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = residual_without_diagnostics_text()
    config = tmp_path / "mine.yaml"
    config.write_text(text[: text.index("    - class_path: lightning.pytorch.callbacks.ModelCheckpoint")])
    for version in ("run-a", "run-b"):
        logger = {"class_path": "no_folder.NoFolder", "init_args": {"save_dir": str(tmp_path), "version": version}}
        main(["fit", "--config", str(config), *RUN, "--trainer.max_epochs", "1", "--trainer.limit_train_batches",
              str(1 if version == "run-a" else 2), "--trainer.logger", json.dumps(logger)])  # fmt: skip
    assert loops(tmp_path / "runs/run-a/checkpoints/last.ckpt") == (1, 1)
    assert loops(tmp_path / "runs/run-b/checkpoints/last.ckpt") == (2, 1)
    assert not (tmp_path / "checkpoints").exists()


# -- the atomic write ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def file_size_limit(size: int):
    """No file written past ``size`` bytes meanwhile: a write past it fails (EFBIG) as on a full disk."""
    limits, previous = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)


def test_the_checkpoint_is_fsynced_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isfile(f"/proc/self/fd/{fd}") or not os.path.isdir(f"/proc/self/fd/{fd}"):
            synced.append((os.fstat(fd).st_size, (tmp_path / "last.ckpt").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(1000)}, tmp_path / "last.ckpt")
    size = (tmp_path / "last.ckpt").stat().st_size
    assert (size, False) in synced  # the whole file was flushed to disk before it took the name


def test_the_checkpoint_is_written_as_a_hidden_file_beside_it(tmp_path, monkeypatch):
    """In the checkpoint's own folder (a rename within one filesystem is atomic; Lightning's own plugin writes in the
    system's temporary folder, and moving from there to another filesystem copies over the old file), named after
    it, hidden: what a killed save can leave behind says what it was. Its mode is any new file's."""
    written = []
    real_fsync = os.fsync

    def fsync(fd):
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if target.is_file():
            written.append(target)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(10)}, tmp_path / "runs" / "last.ckpt")
    [temporary] = written
    assert temporary.parent == tmp_path / "runs" and temporary.name.startswith(".last.ckpt.")
    assert temporary.suffix == ".part"
    umask = os.umask(0o027)  # what the saved file's mode follows, as any new file's: rw for whom the umask allows
    try:
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(10)}, tmp_path / "other.ckpt")
    finally:
        os.umask(umask)
    assert (tmp_path / "other.ckpt").stat().st_mode & 0o777 == 0o640


def test_a_save_that_fails_half_way_leaves_the_old_checkpoint_whole(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(100_000)}, path)
    with file_size_limit(200_000):  # half the new file's 400 kB
        io.save_checkpoint({"step": 2, "w": torch.zeros(100_000)}, path)
    with pytest.raises(NoRoomError) as failed:
        io.teardown()  # the end of fit, or LastCheckpoint's next save, raises it
    message = str(failed.value)
    assert message.startswith(f"no room to save checkpoint last.ckpt in {tmp_path} (File too large): it needs ")
    assert f"the last good checkpoint is {path}" in message and "\n" not in message
    assert torch.load(path, weights_only=False)["step"] == 1  # whole and loadable
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind


@pytest.mark.parametrize(
    "oldest_first, good",
    [(["last.ckpt", "best-epoch03.ckpt"], "last.ckpt"),
     (["best-epoch03.ckpt", "best-epoch01.ckpt"], "best-epoch01.ckpt"),
     ([], None)],
)  # fmt: skip
def test_a_full_disk_names_the_last_good_checkpoint(tmp_path, oldest_first, good):
    """last.ckpt if there is one, even beside a newer file; else the newest checkpoint; else says there is none."""
    for age, name in enumerate(reversed(oldest_first)):
        (tmp_path / name).write_bytes(b"a checkpoint")
        os.utime(tmp_path / name, (1e9 - age * 100, 1e9 - age * 100))
    (tmp_path / "notes.txt").write_text("not a checkpoint, and the newest file")
    io = AtomicCheckpointIO()
    with file_size_limit(100):
        io.save_checkpoint({"global_step": 2, "w": torch.ones(100)}, tmp_path / "new.ckpt")
    said = f"the last good checkpoint is {tmp_path / good}" if good else "no checkpoint had been saved before"
    assert said in str(io.failed)


# -- --ckpt_path last | best ---------------------------------------------------------------------------------


def fake_run(runs: Path, version: str, best: str | None = None) -> Path:
    """A run folder with a last.ckpt (and a best file named in it, as ModelCheckpoint's state does)."""
    ckpts = runs / version / "checkpoints"
    ckpts.mkdir(parents=True)
    state = {"monitor": "loss/val", "best_model_path": str(ckpts / best) if best else ""}
    callbacks = {"ModelCheckpoint{'monitor': 'loss/val'}": state} if best else {}
    torch.save({"state_dict": {}, "callbacks": callbacks, "version": version}, ckpts / "last.ckpt")
    if best:
        torch.save({"state_dict": {}, "version": version}, ckpts / best)
    return ckpts


def test_ckpt_path_last_is_the_newest_run_counting_versions_as_numbers(tmp_path):
    for version in ["version_0", "version_2", "version_9"]:
        fake_run(tmp_path, version)
    newest = fake_run(tmp_path, "version_10", best="best-epoch03.ckpt")
    assert latest_checkpoint(tmp_path, "last") == str(newest / "last.ckpt")
    assert latest_checkpoint(tmp_path, "best") == str(newest / "best-epoch03.ckpt")


def test_ckpt_path_last_names_a_newer_run_without_a_checkpoint(tmp_path):
    fake_run(tmp_path, "version_0")
    fake_run(tmp_path, "version_1")
    (tmp_path / "version_2").mkdir()  # stopped before its first save
    with pytest.raises(GptLitError) as failed:
        latest_checkpoint(tmp_path, "last")
    assert re.search(r"the newest run, .*version_2, has no checkpoint", str(failed.value))
    newest_with_one = tmp_path / "version_1" / "checkpoints" / "last.ckpt"
    assert str(failed.value).endswith(f"; the newest with one: --ckpt_path {newest_with_one}")


def test_ckpt_path_last_skips_what_is_not_a_version_folder_and_says_when_there_is_no_run(tmp_path):
    with pytest.raises(GptLitError, match="--ckpt_path last: the logger has no save_dir, so there is no run folder"):
        latest_checkpoint(None, "last")
    (tmp_path / "version_old").mkdir()  # not version_N
    (tmp_path / "version_7").write_text("a file, not a run")
    with pytest.raises(GptLitError, match=f"--ckpt_path best: no run in {tmp_path} "):
        latest_checkpoint(tmp_path, "best")
    (tmp_path / "version_3").mkdir()  # the only run, stopped before its first save: nothing older to name
    with pytest.raises(GptLitError) as failed:
        latest_checkpoint(tmp_path, "last")
    assert str(failed.value).endswith("stopped before its first save, or ran with checkpointing off)")
    fake_run(tmp_path, "version_0")
    (tmp_path / "version_3").rmdir()
    assert latest_checkpoint(tmp_path, "last") == str(tmp_path / "version_0" / "checkpoints" / "last.ckpt")


def test_ckpt_path_best_with_two_monitors_names_both_and_how_to_pick(tmp_path):
    ckpts = fake_run(tmp_path, "version_0", best="best-epoch01.ckpt")
    state = torch.load(ckpts / "last.ckpt", weights_only=False)
    state["callbacks"]["ModelCheckpoint{'monitor': 'loss/train'}"] = {"monitor": "loss/train", "best_model_path": ""}
    torch.save(state, ckpts / "last.ckpt")
    with pytest.raises(GptLitError) as ambiguous:
        latest_checkpoint(tmp_path, "best")
    message = str(ambiguous.value)
    assert "ModelCheckpoint{'monitor': 'loss/val'}: " + str(ckpts / "best-epoch01.ckpt") in message
    assert "ModelCheckpoint{'monitor': 'loss/train'}: none yet" in message and "--ckpt_path <its path>" in message


def test_ckpt_path_best_without_a_best_file_says_so(tmp_path):
    fake_run(tmp_path, "version_0")
    with pytest.raises(GptLitError, match="keeps no best checkpoint"):
        latest_checkpoint(tmp_path, "best")


def test_ckpt_path_last_with_several_loggers_looks_where_the_first_one_logs(tmp_path):
    tensorboard = Namespace(class_path="TensorBoardLogger", init_args=Namespace(save_dir="logs", name="residual"))
    csv = Namespace(class_path="CSVLogger", init_args=Namespace(save_dir="csv", name="lightning_logs"))
    assert runs_folder(Namespace(logger=[tensorboard, csv])) == Path("logs/residual")


def test_ckpt_path_last_looks_where_each_kind_of_logger_puts_its_runs():
    """Lightning's default logger (``logger`` unset or true) under default_root_dir; a logger's save_dir (empty:
    default_root_dir) and name; no folder for no logger, an empty list, or a logger without a save_dir."""
    tb = "TensorBoardLogger"
    cases = [
        (Namespace(logger=None), Path("lightning_logs")),
        (Namespace(logger=True, default_root_dir="runs"), Path("runs/lightning_logs")),
        (Namespace(logger=None, default_root_dir="runs"), Path("runs/lightning_logs")),
        (Namespace(logger=Namespace(class_path=tb, init_args=Namespace(save_dir="", name="x")), default_root_dir="r"),
         Path("r/x")),
        (Namespace(logger=Namespace(class_path=tb, init_args=Namespace(save_dir="logs"))), Path("logs")),
        (Namespace(logger=False), None),
        (Namespace(logger=[]), None),
        (Namespace(logger=Namespace(class_path="MLFlowLogger", init_args=Namespace(experiment_name="x"))), None),
    ]  # fmt: skip
    for trainer, folder in cases:
        assert runs_folder(trainer) == folder, trainer


# -- three inputs that ended without a clear line ---------------------------------------------------------------


def error_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as ended:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_negative_num_workers_is_one_error_line(capsys):
    line = error_line(["fit", *TINY, "--data.num_workers", "-1"], capsys)
    assert line == "error: data.num_workers must be 0 (load in the main process) or more, got -1"


def test_a_bad_key_in_a_config_given_with_c_names_the_file_and_line(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text("model:\n  lr: 0.001\n  bogus: 3\n")
    line = error_line(["fit", "-c", str(mine)], capsys)
    assert line.startswith("error: ") and "model.bogus" in line and f"in {mine}, line 3" in line, line


def test_an_empty_config_file_says_so(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    line = error_line(["fit", "--config", str(empty)], capsys)
    assert line.startswith(f"error: {empty} is not a config: the file is empty"), line
