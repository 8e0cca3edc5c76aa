"""``last.ckpt``: always the newest state a run can resume from exactly; Ctrl-C and SIGTERM save it and stop."""

import csv
import os
import signal
import threading
from typing import Any

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tensorboard.compat.proto.event_pb2 import Event, SessionLog

from gpt_lit.run.checkpoints import AtomicCheckpointIO, BackgroundCheckpointIO, NoRoomError

CTRL_C_MESSAGE = "finishing this step; Ctrl-C again to stop at once"


class LastCheckpoint(Checkpoint):
    """Saved after a step no validation follows (a stop asked, another callback's save, the end of fit), after a
    validation, at an epoch's end unless ``max_steps`` is set (its restore counts the epoch twice); a stop then raises
    Lightning's ``SIGTERMException``. A resume hides (TensorBoard) and drops (CSV) what the old run logged since.
    (Lightning's ``save_last`` saves where its ModelCheckpoint does; its SIGTERM stops an evaluation.)"""

    def __init__(self) -> None:
        self.path: str | None = None  # last.ckpt beside the config's ModelCheckpoint's files, once fit has started
        self.log_dir: str | None = None
        self.logger_version: int | str | None = None
        self.stop: str | None = None  # "Ctrl-C" or "SIGTERM" once asked to stop
        self._asked = False  # the processes agreed to stop (_ask)
        self._stopping = False  # last.ckpt saved since: raise at the next hook after the logs
        self._others_saved_at = -1  # global step of another callback's latest save
        self._forced = False  # the validation under way runs because a callback asked fit to stop
        self._taken: set[int] = set()  # the signals this fit's handler was given
        self._csv_rows: dict[int, list[dict[str, str]]] = {}  # a resumed run's CSV loggers' earlier rows

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:  # the CLI's fit only
        self.log_dir = trainer.log_dir  # a broadcast: read here for the resume command after a stop
        if trainer.is_global_zero and trainer.logger is not None:
            self.logger_version = trainer.logger.version
        # Beside the config's ModelCheckpoint (one with a monitor first), else where Lightning would put one
        ours = sorted((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath),
                      key=lambda cb: not cb.monitor)  # fmt: skip
        if not ours:
            ours = [ModelCheckpoint(save_top_k=0)]  # saves nothing; its setup resolves the folder
            ours[0].setup(trainer, pl_module, "fit")
        self.path = os.path.join(str(ours[0].dirpath), "last.ckpt")
        for callback in trainer.checkpoint_callbacks:  # set up before this one: their dirpath is known
            if isinstance(callback, ModelCheckpoint) and callback.save_last and (callback.dirpath is None or
                    os.path.realpath(callback.dirpath) == os.path.dirname(os.path.realpath(self.path))):  # fmt: skip
                callback.save_last = False  # one writer for last.ckpt: else it writes last-v1.ckpt beside

    def read_csv_logs(self, trainer: L.Trainer) -> None:
        """The CSV loggers' ``metrics.csv``, which CSVLogger deletes as it starts: a resume keeps its earlier rows."""
        self._csv_rows = {}
        for i, logger in enumerate(trainer.loggers):
            path = os.path.join(logger.log_dir, "metrics.csv") if isinstance(logger, CSVLogger) else ""
            if os.path.isfile(path):
                with open(path, newline="") as f:
                    self._csv_rows[i] = list(csv.DictReader(f))

    @property
    def saved_path(self) -> str | None:
        return self.path if self.path and os.path.isfile(self.path) else None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # the second one raises KeyboardInterrupt
            if rank_zero_only.rank == 0:
                os.write(2, f"\n{CTRL_C_MESSAGE}\n".encode())  # not print(): the handler may interrupt a print
        self.stop = self.stop or ("Ctrl-C" if signum == signal.SIGINT else "SIGTERM")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop, self._asked, self._stopping, self._taken = None, False, False, set()

    def _take_signals(self, *hook_args: Any) -> None:
        # after Lightning's (it puts back the ones from before the run); Ctrl-C where it would raise KeyboardInterrupt
        for signum in (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ():
            ours = signum == signal.SIGTERM or signal.getsignal(signum) is signal.default_int_handler
            if signum not in self._taken and ours:
                signal.signal(signum, self._on_signal)
                self._taken.add(signum)

    on_sanity_check_start = _take_signals

    def _ask(self, trainer: L.Trainer) -> bool:
        """Whether any process was asked to stop (every process calls this at the same points)."""
        if not self._asked and trainer.strategy.reduce_boolean_decision(self.stop is not None, all=False):
            sigterm = trainer.strategy.reduce_boolean_decision(self.stop == "SIGTERM", all=False)
            self.stop, self._asked = "SIGTERM" if sigterm else "Ctrl-C", True  # one message and status on every process
        return self._asked

    def _raise_if_stopping(self, *hook_args: Any) -> None:
        # last.ckpt saved after a stop and its values logged: Lightning ends the run as stopped, re-raised to the CLI
        if self._stopping:
            raise SIGTERMException

    on_train_batch_start = on_train_epoch_start = on_train_end = _raise_if_stopping

    @staticmethod
    def _epoch_ran_out(trainer: L.Trainer) -> bool:  # the epoch under way has had its last batch
        progress = trainer.fit_loop.epoch_loop.batch_progress
        return progress.is_last_batch or progress.current.ready >= trainer.num_training_batches

    def _save_if_due(self, trainer: L.Trainer, asked: bool) -> None:
        """Save at a stop ``asked``, the epoch's last step, fit's last (``max_steps``, or a stop Lightning honours), or
        another callback's save; a stop asked then raises at the next hook."""
        ends = 0 <= trainer.max_steps <= trainer.global_step or trainer.should_stop and trainer.fit_loop.epoch_loop.done
        if asked or ends or self._epoch_ran_out(trainer) or self._others_saved_at == trainer.global_step:
            self.save(trainer)
        self._stopping = asked

    @staticmethod
    def _validates_next(trainer: L.Trainer, batch_idx: int) -> bool:
        """Whether Lightning validates right after this step (no public way to ask); no for a time-based interval."""
        every_n_epochs, every = trainer.check_val_every_n_epoch, trainer.val_check_batch
        if not trainer.enable_validation or every_n_epochs and (trainer.current_epoch + 1) % every_n_epochs:
            return False
        if every == float("inf"):
            return trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        done = trainer.fit_loop.total_batch_idx if every_n_epochs is None else batch_idx
        return isinstance(every, int) and (done + 1) % every == 0

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._others_saved_at = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        ran_out = self._epoch_ran_out(trainer)
        if self._stopping or (batch_idx + 1) % trainer.accumulate_grad_batches and not ran_out:
            return  # gradients accumulated, not yet stepped
        asked, honoured = self._ask(trainer), trainer.should_stop and trainer.fit_loop.epoch_loop.done
        if ran_out and trainer.max_steps < 0 or self._validates_next(trainer, batch_idx) and not honoured:
            return  # saved after the validation or epoch's end that comes next (not one a stop request adds: Timer)
        self._save_if_due(trainer, asked)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._forced = trainer.should_stop  # Lightning validates once more before it stops; a resume would not

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ran_out = self._epoch_ran_out(trainer)
        if trainer.sanity_checking or self._forced or self._stopping or ran_out and trainer.max_steps < 0:
            return  # after a forced validation, the step before it (saved then) is the exact state
        self._save_if_due(trainer, self._ask(trainer))  # the epoch's end, if it comes next, runs again on the resume
        self._raise_if_stopping()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._stopping or trainer.max_steps >= 0 or not self._epoch_ran_out(trainer):
            return  # saved after its last step or validation
        self.save(trainer)
        self._stopping = self._ask(trainer)

    def save(self, trainer: L.Trainer) -> None:
        if self.path is None or trainer.sanity_checking or trainer.fast_dev_run:
            return
        self._raise_a_failed_save(trainer)  # another callback's: last.ckpt must not name its file as saved
        others = self._others_saved_at  # its on_save_checkpoint in this save is not another callback's
        trainer.save_checkpoint(self.path, weights_only=False)
        self._others_saved_at = others
        if trainer.world_size > 1:
            self._raise_a_failed_save(trainer)

    def _raise_a_failed_save(self, trainer: L.Trainer) -> None:
        """On every process (a broadcast), the error of a save that found no room on process 0, which writes."""
        io = trainer.strategy.checkpoint_io
        if trainer.world_size > 1 and isinstance(io, BackgroundCheckpointIO):
            io.wait()
        writer = getattr(io, "checkpoint_io", io)  # the one an AsyncCheckpointIO wraps
        failed = writer.failure() if isinstance(writer, AtomicCheckpointIO) else None
        message = trainer.strategy.broadcast(str(failed) if failed else None, src=0)
        if message is not None:
            raise NoRoomError(message)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_signals()
        # Resumed at step S: SessionLog STARTs at S hide the old run's events from S on (two: the first purges none)
        if trainer.ckpt_path is None or trainer.global_step == 0 or not trainer.is_global_zero:
            return
        for i, rows in self._csv_rows.items():
            kept = [{k: v for k, v in row.items() if v != ""} for row in rows if int(row["step"]) < trainer.global_step]
            trainer.loggers[i].experiment.metrics[:0] = kept
        self._csv_rows = {}
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                writer = logger.experiment.file_writer
                for _ in range(2):
                    writer.add_event(Event(step=trainer.global_step, session_log=SessionLog(status=SessionLog.START)))
