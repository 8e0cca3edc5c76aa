"""When the instruments measure: after each validation Lightning runs during ``fit``, at that validation's step."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn


@dataclass(frozen=True)
class Validation:
    """One validation that Lightning ran during ``fit``, as the instruments log it.

    ``step``: the step at which ``self.log`` logged its ``loss/val``. ``epoch``: the epochs trained when it ran,
    ``k`` after epoch k - 1's last batch (counted from 0, as the progress bar counts), a fraction in between
    (``val_check_interval``, a stop that validates early). ``results``: what the module computed on the
    validation set in that validation (``GPTLightning.last_validation``: ``loss/val``, and ``loss/train`` when the
    training set is evaluated too).
    """

    step: int
    epoch: float
    results: dict[str, Any] = field(default_factory=dict)


def validation_results(pl_module: L.LightningModule) -> dict[str, Any]:
    """The results of the validation that just ended (``GPTLightning.last_validation``); empty if the module has
    none (another LightningModule, or a sanity check)."""
    return getattr(pl_module, "last_validation", None) or {}


class AfterValidation(Callback):
    """A callback that runs ``after_validation`` after each validation Lightning runs during ``fit``: whatever
    ``val_check_interval``, ``check_val_every_n_epoch`` or ``limit_val_batches`` make the schedule, never after
    the sanity check, never in an epoch without validation, never under ``validate``.

    The moment is Lightning's own (``on_validation_end``, ``trainer.sanity_checking``, ``trainer.state.fn``). The
    step is the one ``self.log`` gives ``loss/val``: during fit, Lightning validates at the end of a training
    batch, before it counts that batch among the ``batches that stepped``, the count its loggers receive as the
    step (``LoggerConnector.log_metrics``). With automatic optimization and one optimizer
    (GPTLightning's) that count is the ``trainer.global_step`` the batch started with, read here in
    ``on_train_batch_start``: the step is the same whether the batch stepped the optimizer or accumulated.
    """

    batch_start: tuple[int, int] | None = None  # (trainer.global_step, batch_idx) at the latest batch's start

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.batch_start = (trainer.global_step, batch_idx)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING or self.batch_start is None:
            return
        step, batch_idx = self.batch_start
        per_epoch = trainer.num_training_batches
        done = batch_idx + 1 >= per_epoch or not math.isfinite(per_epoch)
        epoch = trainer.current_epoch + 1 if done else trainer.current_epoch + (batch_idx + 1) / per_epoch
        self.after_validation(trainer, pl_module, Validation(step, epoch, validation_results(pl_module)))

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        """What the instrument does after each validation of ``fit`` (on every process)."""
        raise NotImplementedError
