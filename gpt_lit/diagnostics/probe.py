"""What the diagnostics share: the step a validation's ``loss/val`` is logged at (for what goes to TensorBoard with
an explicit step), where figures go, and ``Probe``, a diagnostic that runs the model on fixed validation windows."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.tensorboard import SummaryWriter

from gpt_lit.diagnostics.figures import Chart
from gpt_lit.distributed import shards_parameters


def tensorboards(trainer: L.Trainer) -> list[SummaryWriter]:
    """The writer of every TensorBoard logger of ``trainer``, on the main process (none on the others)."""
    if not trainer.is_global_zero:
        return []
    return [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]


def show(trainer: L.Trainer, tag: str, step: int, chart: Chart, draw: Callable[[Any], None], legend: bool = True):
    """``draw`` on ``chart``'s emptied axes, then the figure into every TensorBoard logger's Images tab as ``tag`` at
    ``step`` (``add_figure``); nothing drawn without one."""
    writers = tensorboards(trainer)
    if writers:
        draw(chart.axes(legend))
        for writer in writers:
            writer.add_figure(tag, chart.fig, step, close=False)


def log_at(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    """``metrics`` to every logger at ``step``, from hooks where ``pl_module.log`` cannot log (a run's start, after
    the module's own validation results)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


def run_epochs(trainer: L.Trainer) -> int | None:
    """The run's number of epochs (``trainer.max_epochs``), the end of the figures' colour scale; None if unlimited."""
    return trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs > 0 else None


class ValidationStep(Callback):
    """Knows, at each validation of ``fit``, the step Lightning logs its ``loss/val`` at (``step``) and the epochs
    trained (``epoch``: k after epoch k - 1's last batch, a fraction for a validation within an epoch).

    Lightning validates at the end of a training batch, before it counts that batch among the steps its loggers
    receive: with one optimizer, that is the ``global_step`` the batch started with, read here."""

    step, epoch = 0, 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        per_epoch = trainer.num_training_batches
        done = batch_idx + 1 >= per_epoch or not math.isfinite(per_epoch)
        self.step = trainer.global_step
        self.epoch = trainer.current_epoch + (1 if done else (batch_idx + 1) / per_epoch)

    @staticmethod
    def fitting(trainer: L.Trainer) -> bool:
        """A validation of ``fit``: not its sanity check, not ``validate``."""
        return trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking


class Probe(ValidationStep):
    """Runs the model on the first ``num_sequences`` validation windows (a fixed batch) after every validation of
    ``fit``, in Lightning's ``on_validation_epoch_end`` (eval mode, no gradients), and with ``at_start`` at step 0
    of a fresh run; on the main process, not under strategies that shard the parameters (said once). A subclass's
    ``probe`` measures, draws and returns the scalars, which go to every logger. ``history`` (for the figures that
    draw every validation so far) goes into checkpoints, so a resumed run's figures are whole."""

    at_start = True

    def __init__(self, num_sequences: int):
        self.num_sequences = num_sequences
        self.history: list[dict[str, Any]] = []
        self.active = True

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        raise NotImplementedError

    def batch(self, pl_module: L.LightningModule) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed windows' inputs and targets, (n, T) each, on the model's device."""
        return self.inputs.to(pl_module.device), self.targets.to(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.active = not shards_parameters(trainer, type(self).__name__)
        val = trainer.datamodule.val_set
        windows = [val[i] for i in range(min(self.num_sequences, len(val)))]
        self.inputs, self.targets = (torch.stack(part) for part in zip(*windows, strict=True))  # (n, T) each
        if self.active and self.at_start and trainer.ckpt_path is None and trainer.loggers and trainer.is_global_zero:
            pl_module.eval()  # a resumed run logged its start already
            try:
                with torch.no_grad():
                    log_at(trainer, self.probe(trainer, pl_module, 0, 0.0), 0)
            finally:
                pl_module.train()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.active and self.fitting(trainer) and trainer.loggers:  # every process: same weights, windows, values
            pl_module.log_dict(self.probe(trainer, pl_module, self.step, self.epoch), sync_dist=True)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
