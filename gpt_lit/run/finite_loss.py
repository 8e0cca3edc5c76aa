"""Stop training at the first NaN or infinite loss, before that step changes the weights."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from gpt_lit.errors import GptLitError
from gpt_lit.run.last_checkpoint import LastCheckpoint


class FiniteLoss(Callback):
    """Raise a ``GptLitError`` naming the step when the training loss is not finite.

    Checked in ``on_before_backward``, so the bad step never reaches the optimizer and nothing is saved
    after it: the checkpoints already on disk (``last.ckpt``, the best one) are the last good ones.
    Under several processes they share their losses first (one all-gather of a number per step), so all of
    them stop together, and the message names the process whose loss it was.
    The GPT CLI adds this callback to every run.
    """

    def __init__(self, last_checkpoint: LastCheckpoint | None = None) -> None:
        """
        Args:
            last_checkpoint: The run's ``LastCheckpoint``, whose file the message names as the last good one
                (the CLI gives it in ``fit``); without it, the trainer's ModelCheckpoint's latest or best file.
        """
        self.last_checkpoint = last_checkpoint

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        losses = loss.detach().float().reshape(1)
        if trainer.world_size > 1:
            losses = trainer.strategy.all_gather(losses).reshape(-1)  # (world_size,)
        bad = (~torch.isfinite(losses)).nonzero()
        if len(bad) == 0:
            return
        rank = int(bad[0])
        where = f", process {rank} of {trainer.world_size}" if trainer.world_size > 1 else ""
        wait = getattr(trainer.strategy.checkpoint_io, "wait", None)  # saves still being written in the background
        if wait is not None:  # (BackgroundCheckpointIO): the message names the files as they will stay
            wait()
        last = self.last_checkpoint.saved_path if self.last_checkpoint is not None else None
        ckpt = trainer.checkpoint_callback  # without LastCheckpoint: a ModelCheckpoint's files
        last = last or (getattr(ckpt, "last_model_path", "") or getattr(ckpt, "best_model_path", "") if ckpt else "")
        kept = f"the last good checkpoint is {last}" if last else "no checkpoint had been saved yet"
        raise GptLitError(
            f"the training loss is {losses[rank].item()} at step {trainer.global_step} (epoch {trainer.current_epoch}, "
            f"batch {trainer.fit_loop.epoch_loop.batch_idx}{where}); training stopped before that update and {kept}. "
            f"Try a smaller model.lr"
        )
