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
from tensorboard.compat.proto.event_pb2 import Event, SessionLog

from gpt_lit.checkpointing import AtomicCheckpointIO, BackgroundCheckpointIO, NoRoomError

CTRL_C_MESSAGE = "finishing this step; Ctrl-C again to stop at once"


class LastCheckpoint(Checkpoint):
    def __init__(self, dirpath: str | None = None):
        """Keep ``<dirpath>/last.ckpt`` the newest state training reached that a run resumes from exactly.

        A state is exact after a whole training step with no evaluation due, or after an epoch's evaluation and
        all its end-of-epoch hooks. ``last.ckpt`` is saved at every epoch's end, after a step at which another
        checkpoint callback saved (``ModelCheckpoint(every_n_train_steps=...)`` or ``train_time_interval``),
        when the run is stopped, and at the end of ``fit``. Best and top-k files stay with the ModelCheckpoints
        the config lists; their own ``save_last`` is turned off here, as this callback owns the name.
        When a validation follows a step is Lightning's own schedule, read from its counters. An epoch that
        ``max_steps``, ``EarlyStopping`` or ``Timer`` cuts short is saved after its last step (or after the
        validation at which fit ends mid-epoch), never at its end, from which Lightning would resume at the next
        epoch and skip the rest of this one.

        Stops: the first Ctrl-C or a SIGTERM lets training reach the next exact state (the step under way; or
        the evaluation and the epoch's end, if they come next), saves ``last.ckpt`` there and stops. A second
        Ctrl-C stops at once without saving: ``last.ckpt`` is then the previous exact state. Under several
        processes they agree on the stop (one all-reduce of a flag per step). A run resumed from a checkpoint
        into its old TensorBoard folder hides what the old run logged after that checkpoint, so TensorBoard
        shows each step once; into its old CSV folder, it keeps the old rows before that checkpoint (Lightning's
        CSVLogger would delete them) and drops the others. The GPT CLI adds this callback to every ``fit``.

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
        self._stopping = False
        self._saving = False
        self._others_saved_at = -1  # global step of another callback's latest save
        self._stepped_at_resume = 0  # Lightning's count of batches that stepped, as a resumed checkpoint had it
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
        self.stop, self._stopping, self._taken = None, False, set()

    def _take_signals(self) -> None:
        # After Lightning registers its handlers (after on_fit_start), so that what it puts back when fit ends, or
        # raises (then no teardown hook runs), is the handler from before the run, not this callback's. SIGTERM in
        # place of Lightning's handler, which stops an evaluation half-way and skips this callback's save; Ctrl-C only
        # where it would raise KeyboardInterrupt (a process started with SIGINT ignored keeps it so).
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

    def _stop(self, trainer: L.Trainer) -> None:
        # Lightning raises SIGTERMException once this step's (or this epoch's) values are logged, and ends the run
        # as stopped (no end-of-fit hooks); a private flag, the one Lightning's own SIGTERM handler sets.
        self._stopping = True
        trainer._signal_connector.received_sigterm = True

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
    def _validates_next(trainer: L.Trainer) -> bool:
        """Whether Lightning runs a validation right after the training step that just ended, read from its own
        counters: ``val_check_batch`` counts the epoch's batches (``batch_idx``), or all batches
        (``total_batch_idx``) when ``check_val_every_n_epoch`` is None; the last batch of an epoch is checked by
        the caller. A time-based interval (``val_check_batch`` not a number of batches) validates at wall-clock
        moments no resume can repeat: the state after a step is then taken as exact for training."""
        every_n_epochs = trainer.check_val_every_n_epoch
        if not trainer.enable_validation:
            return False
        if every_n_epochs is not None and (trainer.current_epoch + 1) % every_n_epochs:
            return False
        every = trainer.val_check_batch
        if not isinstance(every, int):
            return False
        loop = trainer.fit_loop.epoch_loop
        done = loop.total_batch_idx if every_n_epochs is None else loop.batch_idx
        return (done + 1) % every == 0

    def _exact_after_step(self, trainer: L.Trainer) -> bool:
        """Whether the state after this training step is exact: the step stepped, no evaluation comes next, and
        the epoch goes on (its end saves ``last.ckpt`` after the epoch's evaluation). ``max_steps`` reached
        mid-epoch ends fit here: this state is the run's last exact one (Lightning resumes it mid-epoch; the
        end-of-epoch hooks that follow run for an epoch cut short, from which a resume would start the next epoch).
        ``EarlyStopping`` or ``Timer`` asking to stop (once ``min_epochs`` is met) make Lightning validate once more
        and end the epoch: the state before that validation is the last exact one; a resume goes on training from it."""
        loop = trainer.fit_loop.epoch_loop
        if self._epoch_ran_out(trainer):
            return False  # the epoch's evaluation and end come next
        if loop.batch_progress.current.ready % trainer.accumulate_grad_batches:
            return False  # gradients accumulated, not yet stepped
        return self._stop_honoured(trainer) or not self._validates_next(trainer)

    @staticmethod
    def _stop_honoured(trainer: L.Trainer) -> bool:
        """Whether a callback's request to stop (``trainer.should_stop``: EarlyStopping, Timer) ends fit in this
        epoch: Lightning's epoch loop says it is done. Before ``min_epochs`` or ``min_steps`` it goes on training (the
        request stays set), and the schedule of saves and validations is the usual one."""
        return trainer.should_stop and trainer.fit_loop.epoch_loop.done

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if not self._saving:
            self._others_saved_at = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self._stopping or not self._exact_after_step(trainer):
            return
        stop = self._agreed(trainer)
        ends = 0 <= trainer.max_steps <= trainer.global_step or self._stop_honoured(trainer)  # fit ends in this epoch
        if stop or ends or self._others_saved_at == trainer.global_step:
            self.save(trainer)
        if stop:
            self._stop(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Checkpoint callbacks run after the other callbacks' and the module's on_train_epoch_end.
        if trainer.fit_loop.restarted_on_epoch_end:  # the end of the epoch the resumed checkpoint was saved at, again
            # No batch ran since the resume: the loggers' step as it was (see on_train_start; private, as there).
            trainer.fit_loop.epoch_loop._batches_that_stepped = self._stepped_at_resume
            return  # saved already
        if self._stopping or not self._epoch_ran_out(trainer):
            return  # an epoch cut short: saved after its last step, from which Lightning resumes it exactly
        self.save(trainer)
        if self._agreed(trainer):
            self._stop(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Fit ends after this validation, mid-epoch (max_steps reached at a step a validation follows, or
        # EarlyStopping asking to stop here): the state after the validation is the last exact one (Lightning
        # resumes it without validating again). Not after a validation Lightning ran only because a callback had
        # asked to stop at the step before (Timer): that step's state, saved then, is the exact one.
        if trainer.sanity_checking or self._stopping or self._epoch_ran_out(trainer):
            return
        ends = 0 <= trainer.max_steps <= trainer.global_step or self._stop_honoured(trainer)
        if ends and self.saved_step != trainer.global_step:
            self.save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.saved_step != trainer.global_step and self._epoch_ran_out(trainer):
            self.save(trainer)

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
        loop = trainer.fit_loop
        if loop.restarted_on_epoch_end:
            # Resumed under max_steps from a state saved at an epoch's end: Lightning runs that epoch's end
            # again, without a batch, and counts the epoch as processed twice, so every later epoch would take the
            # next epoch's order of batches (the sampler's epoch is that count). Counted once, as in the run that
            # saved it. The count of batches that stepped (the loggers' step) is put back after that end
            # (on_train_epoch_end): Lightning adds one for the validation it skips there.
            for counter in (loop.epoch_progress.current, loop.epoch_progress.total):
                counter.processed -= 1
            self._stepped_at_resume = loop.epoch_loop._batches_that_stepped  # private: Lightning has no public one
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
