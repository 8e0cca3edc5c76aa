"""Where the samples are written: the text to every TensorBoard writer, from the start of a fresh run."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.tensorboard import SummaryWriter


def is_fresh_start(trainer: L.Trainer) -> bool:
    """True at the start of a new run; False when ``fit`` resumed from a checkpoint (``trainer.ckpt_path``: the run
    that saved it logged the start)."""
    return trainer.ckpt_path is None


def tensorboard_writers(trainer: L.Trainer) -> list[SummaryWriter]:
    """The ``SummaryWriter`` of every TensorBoardLogger the trainer has, on the main process (none elsewhere, or
    during the sanity check): images, text and figures go to each (its ``add_*`` calls); the other loggers take
    none."""
    if not trainer.is_global_zero or trainer.sanity_checking:
        return []
    return [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
