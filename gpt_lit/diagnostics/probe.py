"""What the diagnostics share: a validation's step, where figures go, and ``Probe`` (the model on fixed windows)."""

import math
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.tensorboard import SummaryWriter

from gpt_lit import measure
from gpt_lit.diagnostics.figures import Chart
from gpt_lit.distributed import shards_parameters


def tensorboards(trainer: L.Trainer) -> list[SummaryWriter]:
    """The writer of every TensorBoard logger of ``trainer`` on the main process; none on the others."""
    if not trainer.is_global_zero:
        return []
    return [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]


def show(trainer: L.Trainer, tag: str, step: int, chart: Chart, draw: Callable[[Any], None], legend: bool = True):
    """``draw`` on ``chart``'s emptied axes, then ``add_figure`` it as ``tag`` at ``step`` into every TensorBoard."""
    writers = tensorboards(trainer)
    if writers:
        draw(chart.axes(legend))
        for writer in writers:
            writer.add_figure(tag, chart.fig, step, close=False)


def log_at(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    """``metrics`` to every logger at ``step``, where ``pl_module.log`` cannot log (a run's start, after validation)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


class ValidationStep(Callback):
    """At each validation of ``fit``: the step of its ``loss/val`` (``step``: the batch's starting ``global_step``) and
    the epochs trained (``epoch``: k after epoch k - 1's last batch, a fraction within an epoch)."""

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


class History(ValidationStep):
    """A diagnostic whose ``chart`` draws every point so far (``history``, in checkpoints: figures resume whole)."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.chart = Chart()

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))


class Probe(History):
    """Runs ``probe`` (measure, draw, return the scalars) on the first ``num_sequences`` validation windows after every
    validation of ``fit`` and, with ``at_start``, at step 0 of a fresh run; not where parameters are sharded."""

    at_start = True

    def __init__(self, num_sequences: int = 4):
        """Measure on the first ``num_sequences`` validation windows.

        Args:
            num_sequences: How many validation windows to measure on (a fixed batch).
        """
        super().__init__()
        self.num_sequences = num_sequences
        self.active = True

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        raise NotImplementedError

    def record(self, pl_module: L.LightningModule) -> measure.BlockRecord:
        """``measure.record_blocks`` of one pass over the fixed windows (``inputs``, (n, T)), on the model's device."""
        return measure.record_blocks(pl_module.model, self.inputs.to(pl_module.device))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.active = not shards_parameters(trainer, type(self).__name__)
        val = trainer.datamodule.val_set
        windows = [val[i] for i in range(min(self.num_sequences, len(val)))]
        self.inputs, self.targets = (torch.stack(part) for part in zip(*windows, strict=True))  # (n, T) each
        if self.active and self.at_start and trainer.ckpt_path is None and trainer.loggers and trainer.is_global_zero:
            pl_module.eval()  # a resumed run logged its start already
            with torch.no_grad():
                log_at(trainer, self.probe(trainer, pl_module, 0, 0.0), 0)
            pl_module.train()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.active and self.fitting(trainer) and trainer.loggers:  # every process: same weights, windows, values
            pl_module.log_dict(self.probe(trainer, pl_module, self.step, self.epoch), sync_dist=True)
