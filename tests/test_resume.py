"""The documented path: train, press Ctrl-C, run the printed resume command to the end, then ``test`` and
``predict`` the run's ``last``/``best`` checkpoint: they use the final run's weights, quietly.

Every stop at every moment, compared with an uninterrupted run value by value: test_fault_matrix.py.
"""

import json
import logging
import shlex
import signal
import warnings

import pytest
import torch
from conftest import TINY, residual_without_diagnostics, scalars
from lightning.pytorch.callbacks import Callback

from gpt_lit.run.cli import main

RUN = [  # its diagnostics left out: the test reads none (the schedules below run them and compare their tags)
    "--config", residual_without_diagnostics(), *TINY, "--data.eval_train", "false",
    "--data.eval_batch_size", "8", "--trainer.max_epochs", "3",
    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


class CtrlCAt(Callback):
    """Press Ctrl-C once (SIGINT to this process) in the middle of training step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            signal.raise_signal(signal.SIGINT)


def test_ctrl_c_then_the_printed_command_then_test_and_predict_use_the_final_weights(tmp_path, capfd):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (CI may ignore SIGINT)
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path)]
    try:
        try:
            main(["fit", *RUN, *logs], extra_callbacks=[CtrlCAt(step=1)])  # epoch 0's second (last) step
        except SystemExit as stopped:
            assert stopped.code == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    run = tmp_path / "residual" / "version_0"
    err = capfd.readouterr().err
    assert "finishing this step; Ctrl-C again to stop at once" in err and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line == (
        f"error: fit stopped by Ctrl-C; resume with: python -m gpt_lit fit --config {run / 'config.yaml'} "
        f"--ckpt_path {run / 'checkpoints' / 'last.ckpt'} --trainer.logger.init_args.version 0"
    )
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 2  # the step, epoch 0's evaluation and its end: all done before stopping

    main(shlex.split(line.split("resume with: ")[1])[3:])
    final = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert final["global_step"] == 6 and final["epoch"] == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best-epoch02.ckpt", "last.ckpt"]

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        main(["test", *RUN, *logs, "--ckpt_path", "last"])  # the newest run of the config's name
        main(["test", *RUN, *logs, "--ckpt_path", "best"])
    assert (run / "test" / "last").is_dir() and (run / "test" / "best-epoch02").is_dir()
    assert not [w for w in said if "dirpath has changed" in str(w.message)]


def test_a_resume_with_another_lr_and_weight_decay_trains_with_them_and_says_so_once(tmp_path, caplog):
    """The optimizer's state in last.ckpt holds the first run's lr and weight decay; a resume given others trains
    with the ones given, which config.yaml and the HParams row record."""
    monitor = {"class_path": "LearningRateMonitor", "init_args": {"logging_interval": "step", "log_weight_decay": True}}
    args = [*RUN, "--trainer.logger.init_args.save_dir", str(tmp_path), f"--trainer.callbacks+={json.dumps(monitor)}"]
    main(["fit", *args, "--trainer.max_epochs", "1", "--model.lr", "0.01", "--model.weight_decay", "0.1"])
    run = tmp_path / "residual" / "version_0"
    resume = ["--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--trainer.logger.init_args.version", "0"]
    with caplog.at_level(logging.INFO):  # what Lightning's logger prints on stderr
        main(["fit", *args, "--trainer.max_epochs", "2", "--model.lr", "0.05", "--model.weight_decay", "0.2", *resume])
    logged = scalars(run)  # what the optimizer used at each of the 2 + 2 steps
    assert [v for _, v in logged["lr-AdamW"]] == pytest.approx([0.01, 0.01, 0.05, 0.05])
    assert [v for _, v in logged["lr-AdamW-weight_decay"]] == pytest.approx([0.1, 0.1, 0.2, 0.2])
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["optimizer_states"][0]
    assert [(g["lr"], g["weight_decay"]) for g in saved["param_groups"]] == [(0.05, 0.2)]
    said = [r.getMessage() for r in caplog.records if "0.05" in r.getMessage() and "0.01" in r.getMessage()]
    assert len(said) == 1 and "model.lr" in said[0], said


# -- last.ckpt is a state Lightning resumes exactly, whatever the schedule (issue 29's table) -----------------------

SCHEDULE_RUN = [  # without the diagnostics: the losses are compared (every tag of a resumed run: the matrices)
    "--config", residual_without_diagnostics(), *TINY, "--data.eval_train", "false",
    "--data.eval_batch_size", "8", "--trainer.limit_val_batches", "1",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


class SigtermAt(Callback):
    """Send this process SIGTERM (as a scheduler does) in the middle of training step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            signal.raise_signal(signal.SIGTERM)


def train_steps(run) -> dict[str, list[tuple[int, float]]]:
    from test_fault_matrix import logged

    return {tag: values for (plugin, tag), values in logged(run).items() if plugin == "scalars"}


def test_max_steps_mid_epoch_then_more_steps_trains_on_the_rest_of_that_epoch(tmp_path):
    # 3 batches an epoch; max_steps 4 ends fit after epoch 1's first batch; resumed with max_steps 6.
    args = [*SCHEDULE_RUN, "--trainer.max_epochs", "-1", "--trainer.limit_train_batches", "3"]
    main(["fit", *args, "--trainer.max_steps", "6", "--trainer.logger.init_args.save_dir", str(tmp_path / "one")])
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "two")]
    main(["fit", *args, "--trainer.max_steps", "4", *logs])
    run = tmp_path / "two" / "residual" / "version_0"
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 4
    main(["fit", *args, "--trainer.max_steps", "6", *logs, "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
          "--trainer.logger.init_args.version", "0"])  # fmt: skip
    want, got = train_steps(tmp_path / "one" / "residual" / "version_0"), train_steps(run)
    for tag in ("loss/train_step", "loss/val"):
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want[tag]], abs=1e-5), tag


def test_sigterm_before_a_validation_every_n_steps_across_epochs_keeps_that_validation(tmp_path, capsys):
    # Validation every 4 steps counted across epochs of 6: after steps 3, 7 and 11 (loss/val's steps). SIGTERM in
    # epoch 1's second step (step 7, a validation follows it): saved after that step and its validation.
    args = [*SCHEDULE_RUN, "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "6",
            "--trainer.check_val_every_n_epoch", "null", "--trainer.val_check_interval", "4"]  # fmt: skip
    main(["fit", *args, "--trainer.logger.init_args.save_dir", str(tmp_path / "one")])
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "two")]
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args, *logs], extra_callbacks=[SigtermAt(step=7)])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert stopped.value.code == 143 and "resume with: " in line, line
    run = tmp_path / "two" / "residual" / "version_0"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8
    main(shlex.split(line.split("resume with: ")[1])[3:])
    want, got = train_steps(tmp_path / "one" / "residual" / "version_0"), train_steps(run)
    assert [s for s, _ in want["loss/val"]] == [3, 7, 11]
    for tag in ("loss/train_step", "loss/val"):
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want[tag]], abs=1e-5), tag


def test_early_stopping_mid_epoch_saves_where_a_longer_run_goes_on_exactly(tmp_path):
    # Validation twice an epoch (after batches 1 and 3 of 4). EarlyStopping in mode max with patience 2 sees the
    # falling loss/val get "worse" twice and stops fit at the third validation, in epoch 1's middle. Resumed without
    # it, the run goes on as one that never had it.
    args = [*SCHEDULE_RUN, "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4",
            "--trainer.val_check_interval", "0.5"]  # fmt: skip
    main(["fit", *args, "--trainer.logger.init_args.save_dir", str(tmp_path / "one")])
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "two")]
    stopper = {"class_path": "EarlyStopping", "init_args": {"monitor": "loss/val", "mode": "max", "patience": 2}}
    main(["fit", *args, *logs, f"--trainer.callbacks+={json.dumps(stopper)}"])
    run = tmp_path / "two" / "residual" / "version_0"
    assert [s for s, _ in train_steps(run)["loss/val"]] == [1, 3, 5]  # stopped at the third validation
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 6  # epoch 1's second step and its validation: not the end of that epoch
    main(["fit", *args, *logs, "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
          "--trainer.logger.init_args.version", "0"])  # fmt: skip
    want, got = train_steps(tmp_path / "one" / "residual" / "version_0"), train_steps(run)
    for tag in ("loss/train_step", "loss/val"):
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want[tag]], abs=1e-5), tag


@pytest.mark.parametrize("val_batches", ["1", "0"], ids=["validated", "no_validation"])
def test_an_epochs_end_without_max_steps_resumed_with_max_steps_is_refused_with_one_line(tmp_path, val_batches, capsys):
    # Saved at epoch 0's end by a run without max_steps; Lightning's restore under a max_steps would run that epoch's
    # end twice (epoch 1 counted as 2, its hooks again), so the resume says what to do instead, and writes nothing.
    args = [*SCHEDULE_RUN, "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", val_batches,
            "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    main(["fit", *args, "--trainer.max_epochs", "1"])
    run = tmp_path / "residual" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *args, "--trainer.max_epochs", "-1", "--trainer.max_steps", "5", "--ckpt_path", str(last),
              "--trainer.logger.init_args.version", "0"])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: --ckpt_path {last} was saved at an epoch's end, from which Lightning's restore under a max_steps "
        f"runs that epoch's end twice: resume with --trainer.max_epochs, without --trainer.max_steps"
    ]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_max_steps_at_an_epochs_end_then_test_best_uses_the_best_file(tmp_path):
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path)]
    main(["fit", *RUN, *logs, "--trainer.max_steps", "6"])  # 3 epochs of 2 steps: ends at epoch 2's end
    assert sorted(p.name for p in (tmp_path / "residual" / "version_0" / "checkpoints").iterdir()) == [
        "best-epoch02.ckpt", "last.ckpt"]  # fmt: skip
    main(["test", *RUN, *logs, "--ckpt_path", "best"])
    assert (tmp_path / "residual" / "version_0" / "test" / "best-epoch02").is_dir()
