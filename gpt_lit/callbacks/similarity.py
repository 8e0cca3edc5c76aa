"""Position similarity: do the positions of a sequence still differ after each block of the stack?"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from gpt_lit.callbacks.block_pass import record_blocks
from gpt_lit.callbacks.figures import ReusedFigure, add_figure, run_epochs, similarity_figure
from gpt_lit.callbacks.probe import ValidationProbe
from gpt_lit.callbacks.tensorboard_log import log_scalars, tensorboard_writers
from gpt_lit.model import GPT


def mean_position_similarity(hidden: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity over all pairs of different positions i != j, per sequence, then averaged.

    hidden: (B, T, C) vectors of each position. Returns a scalar; 1 means every position is the same vector.
    """
    B, T, _ = hidden.shape
    unit = F.normalize(hidden.float(), dim=-1)  # (B, T, C)
    sims = unit @ unit.transpose(1, 2)  # (B, T, T)
    off_diagonal = sims.sum(dim=(1, 2)) - sims.diagonal(dim1=1, dim2=2).sum(dim=1)  # (B,)
    return (off_diagonal / (T * (T - 1))).mean()


def block_outputs(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """The stream after each block, 1 .. n_layers, (B, T, emb_dim) each, for the token IDs ``idx`` (B, T).

    One pass of ``model.hidden_states`` with forward hooks (``record_blocks``), in whatever mode the model is in.
    """
    return record_blocks(model, idx).block_out


@torch.no_grad()
def block_similarities(model: GPT, idx: torch.Tensor) -> list[float]:
    """``mean_position_similarity`` of the output of each block, 1 .. n_layers, for the token IDs ``idx`` (B, T).

    The last value is the similarity at the top of the stack, before the final norm.
    """
    return similarities(block_outputs(model, idx))


def similarities(outputs: list[torch.Tensor]) -> list[float]:
    """``mean_position_similarity`` of each block's output."""
    return [mean_position_similarity(out).item() for out in outputs]


class PositionSimilarity(ValidationProbe):
    def __init__(self, num_sequences: int = 4, figure: bool = True):
        """Log the similarity between positions after every block, at the start of training and after every validation.

        The mean cosine similarity between the output vectors of different positions of a sequence, over the first
        ``num_sequences`` validation windows (a fixed batch), evaluated without dropout and without gradients:
        ``similarity/block_1`` ... ``similarity/block_N`` at the output of each block, and ``similarity/positions`` at
        the top of the stack (before the final norm; equal to block_N), the chapter's number: 0.563 with residuals,
        1.000 without (12 blocks, untrained). The values of each validation of ``fit`` share the step of its
        ``loss/val``; to every logger. With ``figure``, after every validation the image ``figures/similarity_by_block``
        (to every TensorBoard logger): the similarity against depth, one line per measurement so far (the start
        included). Skipped, with one logged line, under strategies that shard the parameters.

        Args:
            num_sequences: How many validation windows to average over (a fixed batch).
            figure: Draw the figure too (else the scalars only).
        """
        super().__init__(num_sequences)
        self.figure = figure
        self.reused = ReusedFigure()  # the figure, drawn again after each validation

    def measure(self, model: GPT, batch: torch.Tensor) -> list[float]:
        """The similarity after each block of ``model`` for the fixed batch."""
        return similarities(self.blocks(model, batch).block_out)  # as block_similarities, from the shared pass

    def record(
        self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float, blocks: list[float]
    ) -> None:
        self.history.append({"step": step, "epoch": epoch, "blocks": blocks})  # epoch 0: the start
        metrics = {f"similarity/block_{i}": v for i, v in enumerate(blocks, 1)}
        metrics["similarity/positions"] = blocks[-1]
        log_scalars(trainer, metrics, step)
        writers = tensorboard_writers(trainer)
        if self.figure and epoch > 0 and writers:  # after a validation (epoch 0: the start, drawn with the first)
            fig = similarity_figure(self.history, self.reused, run_epochs(trainer))
            add_figure(writers, "figures/similarity_by_block", fig, step)
