"""``last.ckpt``: always the newest state a run can resume from exactly; Ctrl-C and SIGTERM save it and stop."""

from __future__ import annotations

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

from gpt_lit.run.saving import AtomicCheckpointIO, BackgroundCheckpointIO, NoRoomError

CTRL_C_MESSAGE = "finishing this step; Ctrl-C again to stop at once"


class LastCheckpoint(Checkpoint):
    def __init__(self, dirpath: str | None = None):
        """Keep ``<dirpath>/last.ckpt`` the newest state training reached that Lightning's restore resumes exactly.

        Lightning's own ``--ckpt_path`` restore is exact from three moments, and ``last.ckpt`` is saved only there:
        the end of a training step that no validation follows (``on_train_batch_end``), the end of a validation in
        ``fit`` (``on_validation_end``), and an epoch's end (``on_train_epoch_end``) unless ``max_steps`` is set (its
        restore would count that epoch twice: under ``max_steps`` an epoch is saved after its last step or after the
        validation that follows it, and its end runs again on a resume). A step is saved (or the validation after it)
        when a stop was asked, when another checkpoint callback saved at it (``every_n_train_steps``,
        ``train_time_interval``), or when fit ends after it (``max_steps``, ``EarlyStopping``, ``Timer``).
        Best and top-k files stay with the ModelCheckpoints the config lists; their own
        ``save_last`` is turned off here, as this callback owns the name.

        Stops: the first Ctrl-C or a SIGTERM lets training reach the next such moment, saves ``last.ckpt`` there and
        stops with Lightning's ``SIGTERMException`` once that moment's values are logged. A second Ctrl-C stops at
        once without saving. Under several processes they agree on the stop (one all-reduce of a flag per step).
        A run resumed from a checkpoint into its old TensorBoard folder hides what the old run logged after that
        checkpoint, so TensorBoard shows each step once; into its old CSV folder, it keeps the old rows before that
        checkpoint (Lightning's CSVLogger would delete them) and drops the others. The GPT CLI adds this callback to
        every ``fit``.

        Args:
            dirpath: Folder of ``last.ckpt``; default: beside the run's other checkpoints (the config's
                ModelCheckpoint's folder, else ``<save_dir>/<name>/<version>/checkpoints`` as Lightning puts them).
        """
        self.dirpath = dirpath
        self.path: str | None = None  # <dirpath>/last.ckpt, once fit has started
        self.log_dir: str | None = None  # the trainer's log_dir, once fit has started
        self.logger_version: int | str | None = None  # the first logger's version, once fit has started
        self.saved_step: int | None = None  # global step of the last.ckpt this process saved last
        self.stop: str | None = None  # "Ctrl-C" or "SIGTERM" once asked to stop
        self._asked = False  # the processes agreed to stop
        self._stopping = False  # last.ckpt saved since: raise at the next hook after the logs
        self._saving = False
        self._others_saved_at = -1  # global step of another callback's latest save
        self._forced = False  # the validation under way runs because a callback asked fit to stop
        self._taken: set[int] = set()  # the signals this fit's handler was given (SIGINT, SIGTERM)
        self._csv_rows: dict[int, list[dict[str, str]]] = {}  # a resumed run's CSV loggers' earlier rows

    # -- where ------------------------------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        # Every process, here (a broadcast): the CLI's resume command reads them after a stop, when another
        # process may have ended already.
        self.log_dir = trainer.log_dir
        if trainer.is_global_zero and trainer.logger is not None:  # the one that logs; process 0 prints the command
            self.logger_version = trainer.logger.version

        self.path = os.path.join(self.dirpath or self._checkpoints_folder(trainer, pl_module), "last.ckpt")
        folder = os.path.dirname(self.path)
        for callback in trainer.checkpoint_callbacks:  # set up before this one: their dirpath is known
            if isinstance(callback, ModelCheckpoint) and callback.save_last:
                if callback.dirpath is None or os.path.realpath(callback.dirpath) == os.path.realpath(folder):
                    callback.save_last = False  # one writer for last.ckpt: else it writes last-v1.ckpt beside

    def read_csv_logs(self, trainer: L.Trainer) -> None:
        """Before ``fit`` resumes: read the CSV loggers' ``metrics.csv``, which Lightning's CSVLogger deletes as it
        starts (before any callback's hook), to put back the old run's rows before the checkpoint's step."""
        self._csv_rows = {}
        for i, logger in enumerate(trainer.loggers):
            path = os.path.join(logger.log_dir, "metrics.csv") if isinstance(logger, CSVLogger) else ""
            if os.path.isfile(path):
                with open(path, newline="") as f:
                    self._csv_rows[i] = list(csv.DictReader(f))

    @staticmethod
    def _checkpoints_folder(trainer: L.Trainer, pl_module: L.LightningModule) -> str:
        """Where the run's other checkpoints go: the folder of the config's ModelCheckpoint (the one with a
        monitor first), else the one Lightning would give a ModelCheckpoint: ``<save_dir>/<name>/<version>/
        checkpoints`` of the first logger (whatever its ``sub_dir``; a run of its own for a logger without a folder
        of its own, as W&B's or MLflow's), ``<default_root_dir>/checkpoints`` without a logger."""
        ours = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
        ours.sort(key=lambda cb: not cb.monitor)
        if ours:
            return str(ours[0].dirpath)
        probe = ModelCheckpoint(save_top_k=0)  # saves nothing; its setup resolves (and broadcasts) the folder
        probe.setup(trainer, pl_module, "fit")
        return str(probe.dirpath)

    @property
    def saved_path(self) -> str | None:
        """``last.ckpt`` if there is one (this run's or an earlier run's in the same folder)."""
        return self.path if self.path and os.path.isfile(self.path) else None

    # -- stops ------------------------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # the second one raises KeyboardInterrupt
            if rank_zero_only.rank == 0:
                os.write(2, f"\n{CTRL_C_MESSAGE}\n".encode())  # not print(): the handler may interrupt a print
        self.stop = self.stop or ("Ctrl-C" if signum == signal.SIGINT else "SIGTERM")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop, self._asked, self._stopping, self._taken = None, False, False, set()

    def _take_signals(self) -> None:
        # After Lightning registers its handlers (after on_fit_start), so that what it puts back when fit ends, or
        # raises, is the handler from before the run, not this callback's. SIGTERM in place of Lightning's handler,
        # which stops an evaluation half-way; Ctrl-C only where it would raise KeyboardInterrupt (a process started
        # with SIGINT ignored keeps it so).
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.SIGINT not in self._taken and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_signal)
            self._taken.add(signal.SIGINT)
        if signal.SIGTERM not in self._taken:
            signal.signal(signal.SIGTERM, self._on_signal)
            self._taken.add(signal.SIGTERM)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_signals()

    def _agreed(self, trainer: L.Trainer) -> bool:
        """Whether any process was asked to stop (every process calls this at the same points)."""
        if trainer.world_size > 1:
            stop = bool(trainer.strategy.reduce_boolean_decision(self.stop is not None, all=False))
            if stop:  # the same reason on every process, for the same message and exit status
                sigterm = trainer.strategy.reduce_boolean_decision(self.stop == "SIGTERM", all=False)
                self.stop = "SIGTERM" if sigterm else "Ctrl-C"
            return stop
        return self.stop is not None

    def _raise_if_stopping(self) -> None:
        # Once last.ckpt holds the moment reached after a stop was asked and that moment's values are logged:
        # Lightning then ends the run as stopped (on_exception, the loggers finalized) and re-raises it to the CLI.
        if self._stopping:
            raise SIGTERMException

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx) -> None:
        self._raise_if_stopping()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_stopping()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_stopping()

    @property
    def stopped_by(self) -> str:
        """What stopped the run, for the CLI's message: "Ctrl-C" or "SIGTERM"."""
        return self.stop or "Ctrl-C"

    # -- when -------------------------------------------------------------------------------------------------

    @staticmethod
    def _epoch_ran_out(trainer: L.Trainer) -> bool:
        """Whether the epoch under way has had its last batch (not cut short by ``max_steps`` or a stop)."""
        progress = trainer.fit_loop.epoch_loop.batch_progress
        return progress.is_last_batch or progress.current.ready >= trainer.num_training_batches

    @staticmethod
    def _fit_ends(trainer: L.Trainer) -> bool:
        """Whether fit ends in this epoch: ``max_steps`` reached, or a callback's request to stop
        (``trainer.should_stop``: EarlyStopping, Timer) that Lightning honours (``min_epochs``/``min_steps`` met)."""
        return 0 <= trainer.max_steps <= trainer.global_step or trainer.should_stop and trainer.fit_loop.epoch_loop.done

    @staticmethod
    def _validates_next(trainer: L.Trainer, batch_idx: int) -> bool:
        """Whether Lightning validates right after this training step (it has no public way to ask): every
        ``val_check_batch`` batches of the epoch, or of all batches when ``check_val_every_n_epoch`` is None; an
        epoch of unknown length at its end. A time-based interval validates at moments no resume can repeat: the
        state after a step is then taken as exact for training."""
        every_n_epochs, every = trainer.check_val_every_n_epoch, trainer.val_check_batch
        if not trainer.enable_validation or every_n_epochs and (trainer.current_epoch + 1) % every_n_epochs:
            return False
        if every == float("inf"):
            return trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        done = trainer.fit_loop.total_batch_idx if every_n_epochs is None else batch_idx
        return isinstance(every, int) and (done + 1) % every == 0

    def _ask(self, trainer: L.Trainer) -> bool:
        self._asked = self._asked or self._agreed(trainer)
        return self._asked

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if not self._saving:
            self._others_saved_at = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        ran_out = self._epoch_ran_out(trainer)
        if self._stopping or (batch_idx + 1) % trainer.accumulate_grad_batches and not ran_out:
            return  # gradients accumulated, not yet stepped
        asked, honoured = self._ask(trainer), trainer.should_stop and trainer.fit_loop.epoch_loop.done
        if ran_out and trainer.max_steps < 0 or self._validates_next(trainer, batch_idx) and not honoured:
            return  # saved after the validation (or the epoch's end) that comes next; a validation that a
            # callback's request to stop adds (Timer) is not: a resume would not run it
        if asked or ran_out or self._fit_ends(trainer) or self._others_saved_at == trainer.global_step:
            self.save(trainer)
            self._stopping = asked

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._forced = trainer.should_stop  # Lightning validates once more before it stops; a resume would not

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ran_out = self._epoch_ran_out(trainer)
        if trainer.sanity_checking or self._forced or self._stopping or ran_out and trainer.max_steps < 0:
            return  # after a forced validation, the step before it (saved then) is the exact state
        asked = self._ask(trainer)
        if asked or ran_out or self._fit_ends(trainer) or self._others_saved_at == trainer.global_step:
            self.save(trainer)  # the epoch's end, if it comes next, runs again on the resume
        self._stopping = asked
        self._raise_if_stopping()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Checkpoint callbacks run after the other callbacks' and the module's on_train_epoch_end. Under max_steps
        # Lightning's restore from here would count this epoch twice: saved after its last step or validation.
        if self._stopping or trainer.max_steps >= 0 or not self._epoch_ran_out(trainer):
            return  # an epoch cut short: saved after its last step or validation
        self.save(trainer)
        self._stopping = self._ask(trainer)

    def save(self, trainer: L.Trainer) -> None:
        if self.path is None or trainer.sanity_checking or trainer.fast_dev_run:
            return
        self._raise_a_failed_save(trainer)  # another callback's: last.ckpt must not name its file as saved
        self._saving = True
        try:
            trainer.save_checkpoint(self.path, weights_only=False)  # all a resume needs, not the weights only
        finally:
            self._saving = False
        if trainer.world_size > 1:
            self._raise_a_failed_save(trainer)
        self.saved_step = trainer.global_step

    def _raise_a_failed_save(self, trainer: L.Trainer) -> None:
        """On every process (one broadcast; under several, once process 0's saves are written), the error of a save
        that found no room on process 0, which alone writes; AtomicCheckpointIO writes and removes nothing since."""
        io = trainer.strategy.checkpoint_io
        if trainer.world_size > 1 and isinstance(io, BackgroundCheckpointIO):
            io.wait()
        writer = getattr(io, "checkpoint_io", io)  # the one an AsyncCheckpointIO wraps
        failed = writer.failure() if isinstance(writer, AtomicCheckpointIO) else None
        message = trainer.strategy.broadcast(str(failed) if failed else None, src=0)
        if message is not None:
            raise NoRoomError(message)

    # -- resuming ---------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_signals()
        # Resumed from a checkpoint at step S: TensorBoard hides events with step >= S from the run's older event
        # files when it reads a SessionLog START at step S (what SummaryWriter(purge_step=S) writes). The old run's
        # values for the steps before S stay; those it logged after that checkpoint (if it stopped later) are
        # redone now. Two of them: TensorBoard's data server takes a run's first START for the start of its first
        # session and purges nothing there.
        if trainer.ckpt_path is None or trainer.global_step == 0 or not trainer.is_global_zero:
            return
        # A CSV logger's file: the old run's rows for the steps before S go back in, ahead of this run's.
        for i, rows in self._csv_rows.items():
            kept = [{k: v for k, v in row.items() if v != ""} for row in rows if int(row["step"]) < trainer.global_step]
            trainer.loggers[i].experiment.metrics[:0] = kept
        self._csv_rows = {}
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                writer = logger.experiment.file_writer  # torch's SummaryWriter's event file writer (public attribute)
                for _ in range(2):
                    writer.add_event(Event(step=trainer.global_step, session_log=SessionLog(status=SessionLog.START)))
