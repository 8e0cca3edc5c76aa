"""LastCheckpoint on a one-weight model: which state last.ckpt holds after each kind of end (the end of fit,
``max_steps`` mid-epoch, a crash after another callback's save, Ctrl-C and SIGTERM, an epoch without validation,
validation within an epoch), and where it lies; resumes that go on as one run (its logs included); the signal
handlers it leaves; under two processes (threads meeting in a fake strategy), one stop and one failed save for both.
A fit here is 8 steps of a linear layer: a fraction of a second, so that mutation testing (docs/testing.md) runs
these for every mutant of gpt_lit/run/last_checkpoint.py."""

import csv
import logging
import os
import signal
import threading
import warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from gpt_lit.run.checkpoints import AtomicCheckpointIO, NoRoomError
from gpt_lit.run.last_checkpoint import CTRL_C_MESSAGE, LastCheckpoint


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
    """Raise before the batch that starts at global step ``step`` (a crash: no save of its own); with ``batch_idx``,
    before the one of them that has that index in its epoch (gradients accumulated: several batches a step)."""

    def __init__(self, step: int, batch_idx: int | None = None):
        self.step, self.batch_idx = step, batch_idx

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step and self.batch_idx in (None, batch_idx):
            raise RuntimeError("crash")


class Signal(Callback):
    """Send ``signum`` to this process during the batch that starts at global step ``step``."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class Steady(OneWeight):
    """Every training batch the same: a resume mid-epoch (a plain DataLoader starts the epoch again) trains on the
    batches the uninterrupted run had."""

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(8, 1)), batch_size=2)


class Numbers(IterableDataset):
    def __iter__(self):
        return ((torch.tensor([float(x)]),) for x in range(8))


class Unsized(OneWeight):
    """The same 4 batches an epoch from a dataset without a length: Lightning learns the epoch's end as it comes."""

    def train_dataloader(self):
        return DataLoader(Numbers(), batch_size=2)


class AskStop(Callback):
    """Ask the trainer to stop after the step that ends at global step ``step``, as ``Timer`` or ``EarlyStopping``
    do."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


class CrashAtEpochEnd(Callback):
    """Raise in the end-of-epoch hooks of epoch ``epoch``, before LastCheckpoint's (checkpoint callbacks run last)."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("crash")


def trainer_for(root: Path, *callbacks, **trainer) -> L.Trainer:
    return L.Trainer(
        default_root_dir=str(root), logger=trainer.pop("logger", False), callbacks=list(callbacks),
        max_epochs=trainer.pop("max_epochs", 2), num_sanity_val_steps=trainer.pop("num_sanity_val_steps", 0),
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", **trainer,
    )  # fmt: skip


def fit(root: Path, *callbacks, ckpt_path=None, model=None, **trainer) -> L.Trainer:
    trainer = trainer_for(root, *callbacks, **trainer)
    trainer.fit(model or OneWeight(), ckpt_path=ckpt_path)
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


def test_last_ckpt_goes_beside_the_configs_model_checkpoint(tmp_path):
    fit(tmp_path / "a", ModelCheckpoint(dirpath=str(tmp_path / "mine"), save_top_k=0), LastCheckpoint(), max_epochs=1)
    assert state(tmp_path / "mine" / "last.ckpt") == (4, 1, 4)
    beside = [ModelCheckpoint(dirpath=str(tmp_path / "plain")), ModelCheckpoint(dirpath=str(tmp_path / "best"),
              monitor="val")]  # fmt: skip
    fit(tmp_path / "b", *beside, LastCheckpoint(), max_epochs=1)
    assert state(tmp_path / "best" / "last.ckpt") == (4, 1, 4)  # the one with a monitor first
    fit(tmp_path / "d", ModelCheckpoint(dirpath=str(tmp_path / "every")), ModelCheckpoint(monitor="val"),
        LastCheckpoint(), max_epochs=1)  # fmt: skip
    assert state(tmp_path / "d" / "checkpoints" / "last.ckpt") == (4, 1, 4)  # the monitored one's: Lightning's folder
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


def test_a_step_a_validation_follows_is_saved_after_that_validation(tmp_path):
    ckpts = tmp_path / "checkpoints"
    every_step = ModelCheckpoint(dirpath=str(ckpts), every_n_train_steps=1, save_top_k=-1)
    with pytest.raises(RuntimeError, match="crash"):  # validations after batches 1 and 3
        fit(tmp_path, every_step, LastCheckpoint(), Crash(step=2), val_check_interval=2)
    assert state(ckpts / "last.ckpt") == (2, 0, 2)  # step 2 validates next: saved after that validation
    with pytest.raises(RuntimeError, match="crash"):  # validation every 3 batches, counted across epochs
        every_step = ModelCheckpoint(dirpath=str(tmp_path / "n" / "checkpoints"), every_n_train_steps=1, save_top_k=-1)
        fit(tmp_path / "n", every_step, LastCheckpoint(), Crash(step=6), val_check_interval=3,
            check_val_every_n_epoch=None)  # fmt: skip
    assert state(tmp_path / "n" / "checkpoints" / "last.ckpt") == (6, 1, 2)  # after step 6 and its validation


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
    assert callback.stop == name and callback.saved_path == str(tmp_path / "checkpoints" / "last.ckpt")
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


def validated(path: Path) -> int:
    """Batches of the latest validation before the state a checkpoint holds."""
    loops = torch.load(path, map_location="cpu", weights_only=False)["loops"]["fit_loop"]
    return loops["epoch_loop.val_loop.batch_progress"]["total"]["completed"]


@pytest.mark.parametrize(
    "trainer, crash, resumes_at",
    [
        ({"limit_val_batches": 0}, (6, None), (6, 1, 2)),  # no validation: every step is a resume point
        ({"val_check_interval": 3}, (7, None), (7, 1, 3)),  # after the 3rd batch of each epoch, not of all batches
        ({"val_check_interval": 2, "check_val_every_n_epoch": 3, "max_epochs": 3}, (6, None), (6, 1, 2)),  # not epoch 1
        ({"val_check_interval": 2, "check_val_every_n_epoch": 3, "max_epochs": 3}, (10, None), (10, 2, 2)),  # epoch 2
        ({"model": Unsized()}, (6, None), (6, 1, 2)),  # an epoch of unknown length validates at its end only
        ({"accumulate_grad_batches": 2}, (1, 3), (1, 0, 2)),  # the 3rd batch only accumulates: not a step
    ],
    ids=["no-validation", "every-3-batches", "every-3rd-epoch-not-this", "every-3rd-epoch-this", "unsized", "accum"],
)
def test_after_a_crash_last_ckpt_is_the_newest_step_saved_by_another_callback_or_its_validation(
    tmp_path, trainer, crash, resumes_at
):
    ckpts = tmp_path / "checkpoints"
    every_step = ModelCheckpoint(dirpath=str(ckpts), every_n_train_steps=1, save_top_k=-1)
    with pytest.raises(RuntimeError, match="crash"):
        fit(tmp_path, every_step, LastCheckpoint(), Crash(*crash), **trainer)
    assert state(ckpts / "last.ckpt") == resumes_at


@pytest.mark.parametrize(
    "trainer, end",
    [({"limit_train_batches": 2}, (4, 2, 2)), ({"model": Unsized()}, (8, 2, 4))],
    ids=["limit", "sizeless"],
)
def test_epochs_that_limit_train_batches_cuts_or_of_unknown_length_are_saved_at_their_end(tmp_path, trainer, end):
    fit(tmp_path, LastCheckpoint(), **trainer)
    assert state(tmp_path / "checkpoints" / "last.ckpt") == end


def test_max_steps_at_a_step_a_validation_follows_saves_after_that_validation(tmp_path):
    fit(tmp_path, LastCheckpoint(), max_steps=6, val_check_interval=2)
    assert state(tmp_path / "checkpoints" / "last.ckpt") == (6, 1, 2)  # not epoch 0's end: (4, 1, 4)


def test_a_stop_asked_mid_epoch_keeps_the_state_before_the_validation_lightning_adds(tmp_path):
    trainer = fit(tmp_path, LastCheckpoint(), AskStop(step=2))  # as Timer: Lightning validates once more, then ends
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert trainer.global_step == 2 and state(last) == (2, 0, 2) and validated(last) == 0


def test_a_stop_asked_before_min_epochs_keeps_the_usual_resume_points(tmp_path):
    ckpts = tmp_path / "checkpoints"
    every_step = ModelCheckpoint(dirpath=str(ckpts), every_n_train_steps=1, save_top_k=-1)
    with pytest.raises(RuntimeError, match="crash"):  # validations after batches 1 and 3; training goes on
        fit(tmp_path, every_step, LastCheckpoint(), AskStop(step=1), Crash(step=2), val_check_interval=2, min_epochs=2)
    assert state(ckpts / "last.ckpt") == (1, 0, 1)  # step 2 validates next


def test_a_crash_in_the_last_epochs_end_under_max_steps_leaves_the_state_after_its_validation(tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        fit(tmp_path, LastCheckpoint(), CrashAtEpochEnd(epoch=1), max_steps=8)
    assert state(tmp_path / "checkpoints" / "last.ckpt") == (8, 1, 4)  # after its validation; its end runs again


def test_fast_dev_run_writes_no_checkpoint(tmp_path):
    fit(tmp_path, LastCheckpoint(), fast_dev_run=True)
    assert list(tmp_path.rglob("*.ckpt")) == []


def test_a_model_checkpoint_in_another_folder_keeps_its_last_ckpt_and_one_listed_after_writes_none(tmp_path):
    elsewhere = ModelCheckpoint(dirpath=str(tmp_path / "elsewhere"), save_last=True, save_top_k=0)
    mine = ModelCheckpoint(dirpath=str(tmp_path / "mine"), monitor="val", save_top_k=0)  # last.ckpt's folder
    fit(tmp_path / "a", elsewhere, mine, LastCheckpoint(), max_epochs=1)
    assert state(tmp_path / "elsewhere" / "last.ckpt") == state(tmp_path / "mine" / "last.ckpt") == (4, 1, 4)
    after = ModelCheckpoint(save_last=True, save_top_k=0)  # set up after LastCheckpoint: no folder yet
    fit(tmp_path / "b", LastCheckpoint(), after, max_epochs=1)
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["last.ckpt"]


def test_last_ckpt_does_not_go_beside_an_on_exception_checkpoint(tmp_path):
    fit(tmp_path, OnExceptionCheckpoint(dirpath=str(tmp_path / "on_exception")), LastCheckpoint(), max_epochs=1)
    assert state(tmp_path / "checkpoints" / "last.ckpt") == (4, 1, 4)


def test_a_second_run_in_the_same_folder_gives_no_warning_about_its_checkpoints(tmp_path):
    fit(tmp_path, LastCheckpoint(), max_epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, LastCheckpoint(), max_epochs=1)
    assert [str(w.message) for w in caught if "checkpoint" in str(w.message).lower()] == []


def test_the_resume_command_gets_the_log_folder_and_the_loggers_version(tmp_path):
    callback = LastCheckpoint()
    fit(tmp_path, callback, max_epochs=1, logger=TensorBoardLogger(str(tmp_path), name="run", version="v7"))
    assert callback.log_dir == str(tmp_path / "run" / "v7") and callback.logger_version == "v7"


@pytest.mark.parametrize("crash", [False, True], ids=["fit ended", "fit raised"])
def test_after_fit_ctrl_c_interrupts_again_and_sigterm_is_as_before(tmp_path, crash):
    # Lightning calls no teardown hook when fit raises; the handlers go back all the same (a notebook, a script that
    # catches the error, goes on, and a Ctrl-C there must still interrupt).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if crash:
            with pytest.raises(RuntimeError, match="crash"):
                fit(tmp_path, LastCheckpoint(), Crash(step=2), num_sanity_val_steps=1)
        else:
            fit(tmp_path, LastCheckpoint(), num_sanity_val_steps=1)
        assert signal.getsignal(signal.SIGTERM) == sigterm
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, sigterm)


class SigintSeen(Callback):
    """Records SIGINT's handler at the first training batch; with ``ctrl_c_at_sanity_end``, first sends a Ctrl-C as
    the sanity check ends."""

    def __init__(self, ctrl_c_at_sanity_end: bool = False):
        self.ctrl_c_at_sanity_end, self.handlers = ctrl_c_at_sanity_end, []

    def on_sanity_check_end(self, trainer, pl_module):
        if self.ctrl_c_at_sanity_end:
            os.kill(os.getpid(), signal.SIGINT)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.handlers.append(signal.getsignal(signal.SIGINT))


def test_a_process_that_ignores_ctrl_c_still_ignores_it_during_fit(tmp_path):
    # As a job started in the background (nohup, `&`): Ctrl-C in its terminal is not for it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        seen = SigintSeen()
        trainer = fit(tmp_path, LastCheckpoint(), seen, num_sanity_val_steps=1)
        assert seen.handlers == [signal.SIG_IGN] * 8 and trainer.global_step == 8
    finally:
        signal.signal(signal.SIGINT, previous)


def test_after_a_ctrl_c_in_the_sanity_check_a_second_one_stops_at_once(tmp_path, capfd):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        seen = SigintSeen(ctrl_c_at_sanity_end=True)
        trainer = trainer_for(tmp_path, LastCheckpoint(), seen, num_sanity_val_steps=1)
        with pytest.raises(SystemExit):  # the stop asked for: the run ends at its first step
            trainer.fit(OneWeight())
        assert CTRL_C_MESSAGE in capfd.readouterr().err
        assert set(seen.handlers) == {signal.default_int_handler}  # the second Ctrl-C would raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_resumes_under_max_steps_from_epoch_ends_go_on_as_one_fit(tmp_path):
    torch.manual_seed(0)
    csv_logger = CSVLogger(str(tmp_path / "one"))
    fit(tmp_path / "one", LastCheckpoint(), max_steps=12, max_epochs=3, logger=csv_logger, log_every_n_steps=1)
    callback = LastCheckpoint()  # one callback through three fits, each resuming from the one before
    torch.manual_seed(0)
    logged = []
    for steps in (4, 8, 12):
        csv_logger = CSVLogger(str(tmp_path / "three"))  # a new version each
        fit(tmp_path / "three", callback, max_steps=steps, max_epochs=3, ckpt_path=callback.saved_path,
            logger=csv_logger, log_every_n_steps=1)  # fmt: skip
        logged += rows(Path(csv_logger.log_dir) / "metrics.csv")
    one = tmp_path / "one" / "lightning_logs" / "version_0"
    assert state(callback.saved_path) == state(one / "checkpoints" / "last.ckpt") == (12, 2, 4)
    weights = [torch.load(p, weights_only=False)["state_dict"] for p in (callback.saved_path, one / "checkpoints" /
               "last.ckpt")]  # fmt: skip
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[1])
    assert logged == rows(one / "metrics.csv")  # the same steps, epochs and values


def scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """What TensorBoard shows of ``tag`` in a run's folder."""
    events = EventAccumulator(str(folder))
    events.Reload()
    return [(s.step, s.value) for s in events.Scalars(tag)]


def test_a_run_resumed_into_its_old_log_folder_shows_each_step_once_with_the_values_of_one_run(tmp_path):
    def loggers(root: Path) -> list:  # both in <root>/lightning_logs/version_0
        return [CSVLogger(str(root), version=0), TensorBoardLogger(str(root), version=0)]

    torch.manual_seed(0)
    fit(tmp_path / "one", LastCheckpoint(), model=Steady(), max_steps=2, logger=loggers(tmp_path / "one"),
        log_every_n_steps=1)  # fmt: skip
    torch.manual_seed(0)
    every_step = ModelCheckpoint(dirpath=str(tmp_path / "steps"), every_n_train_steps=1, save_top_k=-1)
    fit(tmp_path / "two", every_step, LastCheckpoint(), model=Steady(), logger=loggers(tmp_path / "two"),
        log_every_n_steps=1)  # fmt: skip
    folder = tmp_path / "two" / "lightning_logs" / "version_0"
    for old in folder.glob("events.out.tfevents.*"):  # TensorBoard reads a folder's files in name order: the older
        parts = old.name.split(".")  # run's file named a minute older, as a run resumed later would find it
        parts[3] = str(int(parts[3]) - 60)
        old.rename(folder / ".".join(parts))
    callback = LastCheckpoint()
    trainer = trainer_for(tmp_path / "two", callback, max_steps=2, logger=loggers(tmp_path / "two"),
                          log_every_n_steps=1)  # fmt: skip
    callback.read_csv_logs(trainer)  # as the CLI does before fit: Lightning's CSVLogger deletes metrics.csv
    trainer.fit(Steady(), ckpt_path=str(tmp_path / "steps" / "epoch=0-step=1.ckpt"))
    one = tmp_path / "one" / "lightning_logs" / "version_0"
    assert (folder / "metrics.csv").read_text() == (one / "metrics.csv").read_text()
    assert scalars(folder, "loss") == scalars(one, "loss")


class Meeting:
    """Where two processes, run as threads, meet in a collective call: each gives its value and gets both."""

    def __init__(self) -> None:
        self.values: list = [None, None]
        self.barrier = threading.Barrier(2, timeout=5)

    def exchange(self, rank: int, value) -> list:
        self.values[rank] = value
        self.barrier.wait()
        values = list(self.values)
        self.barrier.wait()
        return values


class OneOfTwo:
    """The strategy of one of two processes: Lightning's own reduce_boolean_decision, over a sum with the other
    process's value, and a broadcast of process ``src``'s value."""

    world_size = 2
    root_device = torch.device("cpu")
    reduce_boolean_decision = ParallelStrategy.reduce_boolean_decision

    def __init__(self, meeting: Meeting, rank: int, checkpoint_io=None) -> None:
        self.meeting, self.rank, self.checkpoint_io = meeting, rank, checkpoint_io

    def reduce(self, tensor, reduce_op=None):
        return sum(self.meeting.exchange(self.rank, tensor))

    def broadcast(self, obj, src=0):
        return self.meeting.exchange(self.rank, obj)[src]


class TrainerOfOneOfTwo:
    """What LastCheckpoint.save reads of a Trainer, in one of two processes. Process 0 alone writes; a save that
    finds no room stays in its AtomicCheckpointIO's ``failed`` (as under several processes) and writes nothing."""

    sanity_checking = fast_dev_run = False
    world_size, global_step = 2, 5

    def __init__(self, strategy: OneOfTwo, writer: AtomicCheckpointIO, no_room: bool = False) -> None:
        self.strategy, self.writer, self.no_room = strategy, writer, no_room

    def save_checkpoint(self, path, weights_only=None):
        if self.strategy.rank == 0 and self.no_room:
            self.writer.failed = NoRoomError(f"no room to save checkpoint {os.path.basename(path)}")
        elif self.strategy.rank == 0:
            Path(path).write_text("saved")


def on_two_processes(*tasks) -> list:
    """Run ``tasks[0]`` and ``tasks[1]`` as processes 0 and 1 (threads): what each returned or raised."""
    done: list = [None, None]

    def run(rank: int) -> None:
        try:
            done[rank] = tasks[rank]()
        except Exception as e:
            done[rank] = e

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done


@pytest.mark.parametrize(
    "asked, told", [((None, None), None), (("SIGTERM", None), "SIGTERM"), ((None, "Ctrl-C"), "Ctrl-C"),
                    (("Ctrl-C", "SIGTERM"), "SIGTERM")]
)  # fmt: skip
def test_under_two_processes_a_stop_asked_of_either_stops_both_for_one_reason(asked, told):
    meeting = Meeting()
    callbacks = [LastCheckpoint(), LastCheckpoint()]
    for callback, stop in zip(callbacks, asked, strict=True):
        callback.stop = stop  # as its signal handler sets it
    trainers = [SimpleNamespace(world_size=2, strategy=OneOfTwo(meeting, rank)) for rank in range(2)]
    agreed = on_two_processes(*(partial(c._ask, t) for c, t in zip(callbacks, trainers, strict=True)))
    assert agreed == [told is not None] * 2 and [c.stop for c in callbacks] == [told, told]


def two_trainers(io: str, no_room: bool = False) -> list[TrainerOfOneOfTwo]:
    writer = AtomicCheckpointIO()
    io0 = {"atomic": writer, "async": AsyncCheckpointIO(writer), "torch": TorchCheckpointIO()}[io]
    meeting = Meeting()
    return [TrainerOfOneOfTwo(OneOfTwo(meeting, 0, io0), writer, no_room),
            TrainerOfOneOfTwo(OneOfTwo(meeting, 1, AtomicCheckpointIO()), AtomicCheckpointIO())]  # fmt: skip


@pytest.mark.parametrize("io", ["atomic", "async"])
@pytest.mark.parametrize("failed", ["another callback's save", "this save"])
def test_under_two_processes_a_save_that_found_no_room_on_process_0_raises_its_error_on_both(tmp_path, io, failed):
    trainers = two_trainers(io, no_room=failed == "this save")
    if failed == "another callback's save":
        trainers[0].writer.failed = NoRoomError("no room to save checkpoint best.ckpt")
    callbacks = [LastCheckpoint(), LastCheckpoint()]
    for callback in callbacks:
        callback.path = str(tmp_path / "last.ckpt")
    raised = on_two_processes(*(partial(c.save, t) for c, t in zip(callbacks, trainers, strict=True)))
    name = "best.ckpt" if failed == "another callback's save" else "last.ckpt"
    assert [(type(e), str(e)) for e in raised] == [(NoRoomError, f"no room to save checkpoint {name}")] * 2
    assert [c.saved_path for c in callbacks] == [None, None] and not (tmp_path / "last.ckpt").exists()


@pytest.mark.parametrize("io", ["atomic", "async", "torch"])
def test_under_two_processes_a_save_with_room_is_saved_on_both(tmp_path, io):
    callbacks = [LastCheckpoint(), LastCheckpoint()]
    for callback in callbacks:
        callback.path = str(tmp_path / "last.ckpt")
    raised = on_two_processes(*(partial(c.save, t) for c, t in zip(callbacks, two_trainers(io), strict=True)))
    assert raised == [None, None] and [c.saved_path for c in callbacks] == [str(tmp_path / "last.ckpt")] * 2
    assert (tmp_path / "last.ckpt").read_text() == "saved"


def test_without_another_checkpoint_callback_no_step_mid_epoch_is_saved(tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        fit(tmp_path, LastCheckpoint(), Crash(step=2))
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_saving_last_ckpt_prints_nothing(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):  # what Lightning prints on stderr
        fit(tmp_path, LastCheckpoint(), max_epochs=1)
    assert [r.getMessage() for r in caplog.records if r.name.endswith("checkpoint_connector")] == []
