"""Stop training at the first NaN or infinite loss, before that step changes the weights."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from gpt_lit.errors import GptLitError
from gpt_lit.run.last_checkpoint import LastCheckpoint


class FiniteLoss(Callback):
    """Raise a GptLitError naming the step (and process) in ``on_before_backward``, so nothing is saved after the bad
    step; the processes share their losses first (one all-gather a step), so all of them stop together."""

    def __init__(self, last_checkpoint: LastCheckpoint | None = None) -> None:
        self.last_checkpoint = last_checkpoint  # whose file the message names as the last good one

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        losses = loss.detach().float().reshape(1)
        if trainer.world_size > 1:
            losses = trainer.strategy.all_gather(losses).reshape(-1)
        bad = (~torch.isfinite(losses)).nonzero()
        if len(bad) == 0:
            return
        rank = int(bad[0])
        where = f", process {rank} of {trainer.world_size}" if trainer.world_size > 1 else ""
        if wait := getattr(trainer.strategy.checkpoint_io, "wait", None):  # saves written in the background
            wait()  # the message names the files as they will stay
        last = self.last_checkpoint.saved_path if self.last_checkpoint else None  # none: checkpointing is off
        kept = f"the last good checkpoint is {last}" if last else "no checkpoint had been saved yet"
        raise GptLitError(
            f"the training loss is {losses[rank].item()} at step {trainer.global_step} (epoch {trainer.current_epoch}, "
            f"batch {trainer.fit_loop.epoch_loop.batch_idx}{where}); training stopped before that update and {kept}. "
            f"Try a smaller model.lr"
        )
