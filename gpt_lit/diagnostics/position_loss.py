"""Loss by position: how well the model predicts the next token after 1, 2, ... context_length tokens of context."""

from typing import Any

import lightning as L
import torch
from torchmetrics import Metric

from gpt_lit.diagnostics.figures import draw_positions
from gpt_lit.diagnostics.probe import History, show


class PositionMeans(Metric):
    """The mean of a per-token value at each position 0 .. n-1 over all sequences: sums and counts, summed under DDP."""

    def __init__(self, n: int):
        super().__init__()
        self.add_state("sum", torch.zeros(n), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(n), dist_reduce_fx="sum")

    def update(self, values: torch.Tensor) -> None:  # (B, T) with T <= n
        T = values.shape[1]
        self.sum[:T] += values.to(self.sum.dtype).sum(dim=0)
        self.count[:T] += values.shape[0]

    def compute(self) -> torch.Tensor:  # (n,); nan at positions never seen
        return self.sum / self.count


class PositionLoss(History):
    def __init__(self, positions: list[int] = [1, 8, 32, 128]):  # noqa: B006 (read only; a list for the YAML)
        """``loss_by_position/<p>`` and ``figures/loss_by_position``: the validation set's loss at each position, from
        the ``token_losses`` each ``validation_step`` returns (no pass of its own).

        Args:
            positions: The positions (1 .. context_length) logged as scalars.
        """
        super().__init__()
        self.positions = list(positions)
        self.means: PositionMeans | None = None  # this validation's sums by position, where the module's tensors are

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.means = PositionMeans(pl_module.model.cfg.context_length).to(pl_module.device)  # each validation afresh

    def on_validation_batch_end(self, trainer, pl_module, outputs: Any, batch, batch_idx, dataloader_idx=0) -> None:
        if isinstance(outputs, dict) and "token_losses" in outputs:  # the validation set's batches (dataloader 0)
            self.means.update(outputs["token_losses"])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.fitting(trainer) or self.means is None or not self.means.update_count:
            return
        losses = self.means.compute().tolist()  # on every process: the sums of all processes (a collective)
        if not trainer.loggers:
            return
        shown = [p for p in self.positions if 1 <= p <= len(losses)]
        pl_module.log_dict({f"loss_by_position/{p}": losses[p - 1] for p in shown}, sync_dist=True)  # equal everywhere
        if not trainer.is_global_zero:
            return
        self.history.append({"step": self.step, "epoch": self.epoch, "losses": losses})
        floor = getattr(trainer.datamodule, "unigram_floor", None)
        show(trainer, "figures/loss_by_position", self.step, self.chart,
             lambda ax: draw_positions(ax, self.history, floor, trainer.max_epochs))  # fmt: skip
