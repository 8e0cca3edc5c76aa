"""The logit lens: what the stream after each block would predict, read out through the final norm and the head."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure

from gpt_lit.callbacks.figures import ReusedFigure, add_figure, epoch_lines, epochs_axes, finish_epochs_axes, run_epochs
from gpt_lit.callbacks.probe import ValidationProbe
from gpt_lit.callbacks.similarity import block_outputs
from gpt_lit.callbacks.tensorboard_log import log_scalars, tensorboard_writers
from gpt_lit.callbacks.unigram import unigram_entropy
from gpt_lit.loss import vocab_blocked_token_losses
from gpt_lit.model import GPT


@torch.no_grad()
def lens_losses(model: GPT, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Cross-entropy against the targets ``y`` of ``head(final_norm(stream after block i))``, for i = 1 .. n_layers.

    x, y: (B, T) token IDs and next tokens. One pass through the blocks (``block_outputs``), in whatever mode the
    model is in. The last value is the model's own loss on (x, y).
    """
    return read_out(model, block_outputs(model, x), y)


@torch.no_grad()
def read_out(model: GPT, outputs: list[torch.Tensor], y: torch.Tensor) -> list[float]:
    """``lens_losses`` from the stream after each block, (B, T, emb_dim) each, and the targets ``y`` (B, T): every
    depth's rows through the final norm, then through the head together (``vocab_blocked_token_losses``)."""
    streams = torch.cat([model.final_norm(out).flatten(0, 1) for out in outputs])  # (n_layers * B * T, emb_dim)
    losses = vocab_blocked_token_losses(streams, model.head.weight, y.flatten().repeat(len(outputs)))
    return losses.view(len(outputs), -1).mean(dim=1).tolist()  # each depth's mean over its B * T tokens


def lens_figure(
    history: list[dict[str, Any]], floor: float | None, into: ReusedFigure | None = None, last: int | None = None
) -> Figure:
    """Lens loss against depth, one line per validation so far (coloured by ``epoch_lines`` up to ``last``), the unigram
    floor dotted."""
    fig, ax = epochs_axes(into=into)
    for point, colour, label in epoch_lines(history, last):
        ax.plot(range(1, len(point["blocks"]) + 1), point["blocks"], "-o", markersize=4, color=colour, label=label)
    if history:
        ax.set_xticks(range(1, len(history[0]["blocks"]) + 1))
    title = "Logit lens: the loss of the stream after each block, read out by the head"
    finish_epochs_axes(
        ax, "stream read out after block", "validation loss (nats)", title, floor, epochs=(history, last)
    )
    return fig


class LogitLens(ValidationProbe):
    at_start = False  # the head reads nothing useful before training
    with_targets = True

    def __init__(self, num_sequences: int = 2):
        """Log the validation loss of the stream after each block, read out through the final norm and the head.

        ``lens/block_1`` ... ``block_N``: the cross-entropy on the first ``num_sequences`` validation windows (a fixed
        batch) when the model's output head reads the stream after block i (through the final norm) instead of after the
        last block; ``block_N`` is the model's own loss on those windows. After every validation of ``fit``, at the step
        of its ``loss/val``, to every logger, on the main process, in eval mode without gradients. The image
        ``figures/lens_by_block`` (to every TensorBoard logger) draws the loss against depth, one line per validation,
        with the unigram floor dotted. Each depth costs one pass of the output head (vocab_size x emb_dim) over the
        batch (its share of a run's time: docs/performance.md). Skipped, with one logged line, under strategies that
        shard the parameters.

        Args:
            num_sequences: How many validation windows to measure on (a fixed batch).
        """
        super().__init__(num_sequences)
        self.floor: float | None = None
        self.reused = ReusedFigure()  # the figure, drawn again after each validation

    def prepare(self, trainer: L.Trainer) -> None:
        ids = getattr(trainer.datamodule, "book_ids", None)
        self.floor = unigram_entropy(ids) if ids is not None else None

    def measure(self, model: GPT, batch: tuple[torch.Tensor, torch.Tensor]) -> list[float]:
        x, y = batch
        return read_out(model, self.blocks(model, x).block_out, y)  # as lens_losses, from the shared pass

    def record(
        self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float, blocks: list[float]
    ) -> None:
        self.history.append({"step": step, "epoch": epoch, "blocks": blocks})
        log_scalars(trainer, {f"lens/block_{i}": v for i, v in enumerate(blocks, 1)}, step)
        writers = tensorboard_writers(trainer)
        if writers:
            fig = lens_figure(self.history, self.floor, self.reused, run_epochs(trainer))
            add_figure(writers, "figures/lens_by_block", fig, step)
