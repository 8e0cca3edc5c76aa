"""On Ctrl-C or SIGTERM during ``fit``, save a checkpoint to resume from."""

from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException


class InterruptCheckpoint(Checkpoint):
    def __init__(self, dirpath: str | None = None, filename: str = "interrupted"):
        """Save ``<dirpath>/<filename>.ckpt`` when ``fit`` is stopped by Ctrl-C or SIGTERM.

        Lightning turns SIGTERM into a ``SIGTERMException`` at the end of the current step and Ctrl-C into a
        ``KeyboardInterrupt``; both reach ``on_exception``. Other exceptions (a bug, a NaN loss) save nothing,
        so a broken model never replaces a good checkpoint (unlike ``ModelCheckpoint(save_on_exception=True)``).
        The GPT CLI adds this callback to every run and prints how to resume.

        Args:
            dirpath: Folder of the checkpoint; default: the ModelCheckpoint's folder, else
                ``<log_dir>/checkpoints``.
            filename: File name, without ``.ckpt``.
        """
        self.dirpath, self.filename = dirpath, filename
        self.saved_path: str | None = None

    def checkpoint_dir(self, trainer: L.Trainer) -> str:
        if self.dirpath:
            return self.dirpath
        ckpt = trainer.checkpoint_callback
        if getattr(ckpt, "dirpath", None):
            return ckpt.dirpath
        return os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if trainer.state.fn != TrainerFn.FITTING or not isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            return
        path = os.path.join(self.checkpoint_dir(trainer), f"{self.filename}.ckpt")
        trainer.save_checkpoint(path)
        self.saved_path = path
