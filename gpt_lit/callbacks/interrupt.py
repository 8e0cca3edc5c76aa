"""Ctrl-C or SIGTERM during ``fit``: finish the step, save a checkpoint to resume from, stop."""

from __future__ import annotations

import os
import signal

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

CTRL_C_MESSAGE = "finishing this step; Ctrl-C again to stop at once"


class InterruptCheckpoint(Checkpoint):
    def __init__(self, dirpath: str | None = None, filename: str = "interrupted"):
        """Save ``<dirpath>/<filename>.ckpt`` when ``fit`` is stopped by Ctrl-C or SIGTERM.

        SIGTERM: Lightning stops at the end of the current step with a ``SIGTERMException``. The first Ctrl-C
        does the same: it prints "finishing this step; Ctrl-C again to stop at once", and training stops
        where SIGTERM would stop it (after the step, or after the evaluation under way), so a resumed run
        equals one that never stopped. A second Ctrl-C stops at once, mid-step (Lightning's
        ``KeyboardInterrupt``; that step is redone on resume). Each case reaches ``on_exception``, which saves.
        Other exceptions (a bug, a NaN loss) save nothing, so a broken model never replaces a good checkpoint
        (unlike ``ModelCheckpoint(save_on_exception=True)``). Under several processes they agree on the
        stop (one all-reduce of a flag per step). The GPT CLI adds this callback to every run and prints how
        to resume.

        Args:
            dirpath: Folder of the checkpoint; default: the ModelCheckpoint's folder, else
                ``<log_dir>/checkpoints``.
            filename: File name, without ``.ckpt``.
        """
        self.dirpath, self.filename = dirpath, filename
        self.saved_path: str | None = None
        self.ctrl_c = False  # the first Ctrl-C arrived: stop after this step
        self.stopping_for_ctrl_c = False  # we asked Lightning to stop as for SIGTERM
        self._previous_handler = None

    def checkpoint_dir(self, trainer: L.Trainer) -> str:
        if self.dirpath:
            return self.dirpath
        ckpt = trainer.checkpoint_callback
        if getattr(ckpt, "dirpath", None):
            return ckpt.dirpath
        return os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")

    # -- the first Ctrl-C -----------------------------------------------------------------------------------

    def _on_sigint(self, signum, frame) -> None:
        self.ctrl_c = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the second one raises KeyboardInterrupt
        if rank_zero_only.rank == 0:
            os.write(2, f"\n{CTRL_C_MESSAGE}\n".encode())  # not print(): the handler may interrupt a print

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Only where Ctrl-C would raise KeyboardInterrupt: a process started with SIGINT ignored keeps it so.
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            pass

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)
            self._previous_handler = None

    def _agreed(self, trainer: L.Trainer) -> bool:
        """Whether any process got the first Ctrl-C (every process must call this at the same point)."""
        if trainer.world_size > 1:
            return trainer.strategy.reduce_boolean_decision(self.ctrl_c, all=False)
        return self.ctrl_c

    def _stop_as_for_sigterm(self, trainer: L.Trainer, stop: bool) -> None:
        # Lightning checks this flag after each training step (and each evaluation batch) and raises
        # SIGTERMException there, with every counter the checkpoint needs already updated.
        self.stopping_for_ctrl_c = stop
        trainer._signal_connector.received_sigterm = stop

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self._previous_handler is not None and not self.stopping_for_ctrl_c and self._agreed(trainer):
            self._stop_as_for_sigterm(trainer, True)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # An evaluation that starts after the step is finished before stopping: a checkpoint taken half-way
        # through it would lose the half-made whole-set losses.
        if self.stopping_for_ctrl_c and not trainer.sanity_checking:
            trainer._signal_connector.received_sigterm = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._previous_handler is not None and not trainer.sanity_checking and self._agreed(trainer):
            # Saved here, where ModelCheckpoint saves last.ckpt after an evaluation (a point Lightning resumes
            # from exactly), rather than after Lightning has moved past the evaluation.
            self.save(trainer)
            self._stop_as_for_sigterm(trainer, True)

    # -- saving -----------------------------------------------------------------------------------------------

    def save(self, trainer: L.Trainer) -> None:
        path = os.path.join(self.checkpoint_dir(trainer), f"{self.filename}.ckpt")
        trainer.save_checkpoint(path, weights_only=False)  # everything needed to resume, not the weights only
        self.saved_path = path

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self.ctrl_c = True
        if trainer.state.fn != TrainerFn.FITTING or not isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            return
        if isinstance(exception, SIGTERMException) and self.saved_path:
            return  # a first Ctrl-C during an evaluation: saved at its end
        self.save(trainer)

    @property
    def stopped_by(self) -> str:
        """What stopped the run, for the CLI's message: "Ctrl-C" or "SIGTERM"."""
        return "Ctrl-C" if self.ctrl_c else "SIGTERM"
