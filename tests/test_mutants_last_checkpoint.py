"""LastCheckpoint on a one-weight model: which state last.ckpt holds after each kind of end (the end of fit,
``max_steps`` mid-epoch, a crash after another callback's save, Ctrl-C and SIGTERM, an epoch without validation,
validation within an epoch), and where it lies. A fit here is 8 steps of a linear layer: a fraction of a second,
so that mutation testing (docs/testing.md) runs these for every mutant of gpt_lit/callbacks/last_checkpoint.py."""

import os
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, TensorDataset

from gpt_lit.callbacks.last_checkpoint import CTRL_C_MESSAGE, LastCheckpoint


class OneWeight(L.LightningModule):
    """4 training batches an epoch (8 numbers, 2 at a time), a validation of 2 batches."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.arange(8.0).view(-1, 1)), batch_size=2)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.arange(4.0).view(-1, 1)), batch_size=2)


class Crash(Callback):
    """Raise before the batch that starts at global step ``step`` (a crash: no save of its own)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("crash")


class Signal(Callback):
    """Send ``signum`` to this process during the batch that starts at global step ``step``."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def fit(root: Path, *callbacks, ckpt_path=None, **trainer) -> L.Trainer:
    trainer = L.Trainer(
        default_root_dir=str(root), logger=trainer.pop("logger", False), callbacks=list(callbacks),
        max_epochs=trainer.pop("max_epochs", 2), num_sanity_val_steps=0, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", **trainer,
    )  # fmt: skip
    trainer.fit(OneWeight(), ckpt_path=ckpt_path)
    return trainer


def state(path: Path) -> tuple[int, int, int]:
    """(global step, epochs whose end ran, batches done in the epoch under way) of a checkpoint: where a resume
    goes on from."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    loops = ckpt["loops"]["fit_loop"]
    return ckpt["global_step"], loops["epoch_progress"]["current"]["processed"], loops[
        "epoch_loop.batch_progress"]["current"]["processed"]  # fmt: skip


def test_the_end_of_fit_and_one_writer_of_last_ckpt(tmp_path):
    ckpts = tmp_path / "checkpoints"
    other = ModelCheckpoint(dirpath=str(ckpts), save_last=True, save_top_k=0)  # would write last-v1.ckpt beside
    fit(tmp_path, other, LastCheckpoint())
    assert state(ckpts / "last.ckpt") == (8, 2, 4)
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt"]


def test_last_ckpt_goes_where_it_is_told_and_beside_the_configs_model_checkpoint(tmp_path):
    fit(tmp_path / "a", LastCheckpoint(dirpath=str(tmp_path / "mine")), max_epochs=1)
    assert state(tmp_path / "mine" / "last.ckpt") == (4, 1, 4)
    beside = [ModelCheckpoint(dirpath=str(tmp_path / "plain")), ModelCheckpoint(dirpath=str(tmp_path / "best"),
              monitor="val")]  # fmt: skip
    fit(tmp_path / "b", *beside, LastCheckpoint(), max_epochs=1)
    assert state(tmp_path / "best" / "last.ckpt") == (4, 1, 4)  # the one with a monitor first
    fit(tmp_path / "c", LastCheckpoint(), max_epochs=1, logger=CSVLogger(str(tmp_path / "c"), name="run"))
    assert (tmp_path / "c" / "run" / "version_0" / "checkpoints" / "last.ckpt").is_file()


def test_max_steps_mid_epoch_saves_after_its_last_step(tmp_path):
    fit(tmp_path, LastCheckpoint(), max_steps=6)
    assert state(tmp_path / "checkpoints" / "last.ckpt") == (6, 1, 2)  # epoch 1 goes on after 2 batches


def test_a_crash_keeps_the_state_after_another_callbacks_save(tmp_path):
    ckpts = tmp_path / "checkpoints"
    every_3 = ModelCheckpoint(dirpath=str(ckpts), every_n_train_steps=3, save_top_k=-1)
    with pytest.raises(RuntimeError, match="crash"):
        fit(tmp_path, every_3, LastCheckpoint(), Crash(step=3))
    assert state(ckpts / "last.ckpt") == (3, 0, 3)


def test_an_epoch_without_validation_is_saved_at_its_end(tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        fit(tmp_path, LastCheckpoint(), Crash(step=6), limit_val_batches=0)
    assert state(tmp_path / "checkpoints" / "last.ckpt") == (4, 1, 4)


def test_a_validation_within_the_epoch_makes_the_step_before_it_no_resume_point(tmp_path):
    ckpts = tmp_path / "checkpoints"
    every_step = ModelCheckpoint(dirpath=str(ckpts), every_n_train_steps=1, save_top_k=-1)
    with pytest.raises(RuntimeError, match="crash"):  # validations after batches 1 and 3
        fit(tmp_path, every_step, LastCheckpoint(), Crash(step=2), val_check_interval=2)
    assert state(ckpts / "last.ckpt") == (1, 0, 1)  # step 2 validates next: its state is not exact
    with pytest.raises(RuntimeError, match="crash"):  # validation every 3 batches, counted across epochs
        every_step = ModelCheckpoint(dirpath=str(tmp_path / "n" / "checkpoints"), every_n_train_steps=1, save_top_k=-1)
        fit(tmp_path / "n", every_step, LastCheckpoint(), Crash(step=6), val_check_interval=3,
            check_val_every_n_epoch=None)  # fmt: skip
    assert state(tmp_path / "n" / "checkpoints" / "last.ckpt") == (5, 1, 1)  # step 6 validates next


@pytest.mark.parametrize("signum, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_a_stop_finishes_the_step_under_way_saves_and_says_what_stopped_it(tmp_path, capfd, signum, name):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        callback = LastCheckpoint()
        with pytest.raises(SIGTERMException):
            fit(tmp_path, callback, Signal(step=5, signum=signum))
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, sigterm)
    assert state(tmp_path / "checkpoints" / "last.ckpt") == (6, 1, 2)
    assert callback.stopped_by == name and callback.saved_path == str(tmp_path / "checkpoints" / "last.ckpt")
    said = CTRL_C_MESSAGE in capfd.readouterr().err
    assert said == (signum == signal.SIGINT)


def test_a_stop_in_an_epochs_last_step_saves_after_its_validation_and_end(tmp_path):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SIGTERMException):
            fit(tmp_path, LastCheckpoint(), Signal(step=3, signum=signal.SIGINT))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert state(tmp_path / "checkpoints" / "last.ckpt") == (4, 1, 4)

