"""Runs that stop early: an infinite loss stops as a NaN does; a run without validation stopped at once in its
second epoch leaves ``last.ckpt`` at the first epoch's end, which the printed command resumes from.

(The NaN loss and Ctrl-C twice in a run with validation: test_robustness.py; every stop at every moment:
test_fault_matrix.py.)
"""

import json
import math
import os
import signal

import pytest
import torch
from conftest import TINY, residual_without_diagnostics
from lightning.pytorch.callbacks import Callback

from gpt_lit.module import GPTLightning
from gpt_lit.run.cli import main

RUN = [
    "--config", residual_without_diagnostics(), *TINY, "--data.eval_train", "false",
    "--trainer.limit_train_batches", "3", "--trainer.max_epochs", "3",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


def test_an_infinite_loss_stops_the_run_with_one_line_and_keeps_the_last_good_checkpoint(
    capsys, tmp_path, monkeypatch
):
    losses = GPTLightning.token_losses

    def infinite_at_step_4(self, batch):  # as a loss that overflows: +inf, not NaN
        values = losses(self, batch)
        return values * math.inf if self.training and self.trainer.global_step == 4 else values

    monkeypatch.setattr(GPTLightning, "token_losses", infinite_at_step_4)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *RUN, "--trainer.limit_val_batches", "1", "--trainer.logger.init_args.save_dir", str(tmp_path)])
    err = capsys.readouterr().err
    last = tmp_path / "residual" / "version_0" / "checkpoints" / "last.ckpt"
    assert exit_.value.code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: the training loss is inf at step 4 (epoch 1, batch 1); training stopped before that update "
        f"and the last good checkpoint is {last}. Try a smaller model.lr"
    ]
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 3 and all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())


class CtrlCTwiceAt(Callback):
    """Press Ctrl-C twice (SIGINT to this process) in the middle of training step ``step``: stop at once."""

    def __init__(self, step: int):
        self.step = step

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)


def test_a_run_without_validation_stopped_in_its_second_epoch_resumes_from_the_first_epochs_end(capfd, tmp_path):
    no_val = [*RUN, "--trainer.limit_val_batches", "0", "--trainer.logger.init_args.save_dir", str(tmp_path)]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (CI may ignore SIGINT)
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["fit", *no_val], extra_callbacks=[CtrlCTwiceAt(step=4)])  # epoch 1's second step
    finally:
        signal.signal(signal.SIGINT, previous)
    assert exit_.value.code == 130
    line = capfd.readouterr().err.strip().splitlines()[-1]
    last = tmp_path / "residual" / "version_0" / "checkpoints" / "last.ckpt"
    assert line.startswith("error: fit stopped by Ctrl-C; resume with: ") and f"--ckpt_path {last}" in line
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    # epoch 0's 3 steps and its end hooks: the printed command resumes at epoch 1's first step (Lightning's resume
    # from such a state: test_fault_matrix.py)
    assert ckpt["global_step"] == 3 and ckpt["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"] == 1


class SavedAt(Callback):
    """The global step of every checkpoint the run writes (``on_save_checkpoint`` runs for each)."""

    def __init__(self):
        self.steps: list[int] = []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.steps.append(trainer.global_step)


def test_early_stopping_before_min_epochs_trains_on_and_saves_at_the_epochs_ends_only(tmp_path):
    # EarlyStopping asks to stop at the first validation (any loss/val is under its threshold); min_epochs 3 makes
    # Lightning go on to the third epoch's end. Nothing ends mid-epoch, so every checkpoint (last.ckpt and the best
    # epoch's) is written at an epoch's end: steps 3, 6, 9 (3 batches an epoch), never after each step.
    stopper = {"class_path": "EarlyStopping", "init_args": {"monitor": "loss/val", "stopping_threshold": 100.0}}
    saved = SavedAt()
    fit = main(["fit", *RUN, "--trainer.limit_val_batches", "1", "--trainer.min_epochs", "3",
                "--trainer.logger.init_args.save_dir", str(tmp_path), f"--trainer.callbacks+={json.dumps(stopper)}"],
               extra_callbacks=[saved])  # fmt: skip
    assert fit.trainer.global_step == 9 and fit.trainer.should_stop  # asked to stop, trained the 3 epochs
    assert saved.steps and set(saved.steps) <= {3, 6, 9}, saved.steps
    last = torch.load(tmp_path / "residual" / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 9
