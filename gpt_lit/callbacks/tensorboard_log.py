"""Where and when the diagnostic callbacks write: TensorBoard's writer, and the step ``self.log`` uses."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.tensorboard import SummaryWriter

from gpt_lit import distributed
from gpt_lit.event_checksums import use_c_checksums


def epoch_end_step(trainer: L.Trainer) -> int:
    """The step Lightning's ``self.log`` gives epoch-end values (``loss/val``, ``loss/train``).

    ``self.log`` counts Lightning's ``_batches_that_stepped``; at the end of an epoch it logs at the last
    training step's index (one less than ``trainer.global_step`` without gradient accumulation). Diagnostics
    logged at the end of an epoch use the same step, so all of an epoch's end lines up in TensorBoard.
    """
    return max(trainer.fit_loop.epoch_loop._batches_that_stepped - 1, 0)


def is_fresh_start(trainer: L.Trainer) -> bool:
    """True at the start of a new run; False when ``fit`` resumed from a checkpoint (its start was logged)."""
    # global_step too: a checkpoint saved in on_train_batch_end holds the step count before Lightning adds that
    # step to _batches_that_stepped (it adds it after on_train_start, checked against Lightning 2.6.6)
    return trainer.global_step == 0 and trainer.fit_loop.epoch_loop._batches_that_stepped == 0


def tensorboard_writer(trainer: L.Trainer) -> SummaryWriter | None:
    """The run's TensorBoard ``SummaryWriter`` on the main process; None elsewhere or without a TensorBoardLogger.

    Its records are checksummed in C from here on (``use_c_checksums``): the images the diagnostics write would
    otherwise be checksummed in pure Python, slowing the diagnostics that run meanwhile."""
    if not trainer.is_global_zero or trainer.sanity_checking:
        return None
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            use_c_checksums()
            return logger.experiment
    return None


def shards_parameters(trainer: L.Trainer, what: str) -> bool:
    """True under a strategy that shards the parameters (FSDP, DeepSpeed, model parallel), after one logged line.

    Such a model can only be run inside the strategy's own forward, so a diagnostic that runs the model on
    its own (``what``) is skipped there.
    """
    sharded = distributed.shards_parameters(trainer)
    if sharded:
        rank_zero_info(f"{what}: skipped under {type(trainer.strategy).__name__}, which shards the parameters")
    return sharded
