"""Loss by position: how well the model predicts the next token after 1, 2, ... context_length tokens of context."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator
from torchmetrics import Metric

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.figures import ReusedFigure, add_figure, epoch_lines, epochs_axes, finish_epochs_axes, run_epochs
from gpt_lit.callbacks.tensorboard_log import log_scalars, tensorboard_writers
from gpt_lit.callbacks.unigram import unigram_entropy


class PositionMeans(Metric):
    """The mean of a per-token value at each position 0 .. n-1 over every sequence seen, across processes.

    Keeps a sum and a count per position (reduced by summing under DDP), so the result is exact whatever the
    number of processes and however the sequences were split among them.
    """

    full_state_update = False

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


def octave_means(losses: list[float]) -> tuple[list[float], list[float]]:
    """The mean loss over positions 1, 2-3, 4-7, 8-15, ... (the last octave up to the end), at each one's middle.

    One position's loss averages one token of each validation window (37 in the chapter's split), so it is
    noisy; an octave's mean averages many.
    """
    centres, means, lo = [], [], 1
    while lo <= len(losses):
        hi = 2 * lo - 1
        if 2 * (hi + 1) > len(losses):  # the last octave runs to the end (64-128, not 64-127 and 128)
            hi = len(losses)
        centres.append((lo * hi) ** 0.5)
        means.append(sum(losses[lo - 1 : hi]) / (hi - lo + 1))
        lo = hi + 1
    return centres, means


def position_figure(
    history: list[dict[str, Any]], floor: float | None, into: ReusedFigure | None = None, last: int | None = None
) -> Figure:
    """Validation loss against position (log scale), per validation (coloured by ``epoch_lines`` up to ``last``): each
    position faint, each octave's mean (1, 2-3, 4-7, ...) bold; the unigram floor dotted."""
    fig, ax = epochs_axes(into=into)
    for point, colour, label in epoch_lines(history, last):
        losses = point["losses"]
        ax.plot(range(1, len(losses) + 1), losses, "-", color=colour, linewidth=0.6, alpha=0.35)
        centres, means = octave_means(losses)
        ax.plot(centres, means, "-o", color=colour, markersize=4, label=label)
    ax.set_xscale("log", base=2)
    if history:
        n = len(history[0]["losses"])
        ticks = [p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if p <= n]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:.0f}")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(1, n)
    title = "Validation loss at each position (faint) and per octave of positions"
    xlabel = "position: tokens of context seen (log scale)"
    finish_epochs_axes(ax, xlabel, "validation loss (nats)", title, floor, epochs=(history, last))
    return fig


class PositionLoss(AfterValidation):
    def __init__(self, positions: list[int] = [1, 8, 32, 128]):  # noqa: B006 (read only; a list for the YAML)
        """Log the whole validation set's loss at each position of a window, from the evaluation that already runs.

        Position p is the prediction of a window's token p + 1 from its first p tokens. Each validation batch's
        ``validation_step`` returns every token's loss (``token_losses``, (B, T)); this callback sums them by
        position as they come (``on_validation_batch_end``) and takes the means over processes at the validation's
        end (``PositionMeans``: exact under DDP); the mean of the per-position losses equals ``loss/val``. After every
        validation of ``fit``, at the step of its ``loss/val``: the scalars ``loss_by_position/<p>`` for the
        ``positions`` up to the context length (to every logger), and the image ``figures/loss_by_position``
        (to every TensorBoard logger), one line per validation, the unigram floor dotted. No forward pass of its own.

        Args:
            positions: The positions (1 .. context_length) logged as scalars.
        """
        self.positions = list(positions)
        self.floor: float | None = None
        self.reused = ReusedFigure()  # the figure, drawn again after each validation
        self.history: list[dict[str, Any]] = []  # {"step", "epoch", "losses"}; in checkpoints
        self.means: PositionMeans | None = None  # this validation's sums by position, where the module's tensors are

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ids = getattr(trainer.datamodule, "book_ids", None)
        self.floor = unigram_entropy(ids) if ids is not None else None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.means = PositionMeans(pl_module.model.cfg.context_length).to(pl_module.device)  # each validation afresh

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if isinstance(outputs, dict) and "token_losses" in outputs:  # the validation set's batches (dataloader 0)
            self.means.update(outputs["token_losses"])

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        if self.means is None or not self.means.update_count:
            return
        losses = self.means.compute().cpu()  # on every process: the sums of all processes (a collective)
        if not trainer.loggers or not trainer.is_global_zero:
            return
        step, losses = validation.step, losses.tolist()
        self.history.append({"step": step, "epoch": validation.epoch, "losses": losses})
        shown = [p for p in self.positions if 1 <= p <= len(losses)]
        log_scalars(trainer, {f"loss_by_position/{p}": losses[p - 1] for p in shown}, step)
        writers = tensorboard_writers(trainer)
        if writers:
            fig = position_figure(self.history, self.floor, self.reused, run_epochs(trainer))
            add_figure(writers, "figures/loss_by_position", fig, step)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
