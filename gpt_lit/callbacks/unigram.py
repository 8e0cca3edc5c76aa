"""The unigram-entropy floor: the loss of a model that ignores context and predicts token frequencies."""

from __future__ import annotations

import lightning as L
import torch

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.tensorboard_log import is_fresh_start, log_scalars, tensorboard_writers


def unigram_entropy(ids: torch.Tensor) -> float:
    """Entropy, in nats, of the token frequencies in ``ids``: -sum p log p over the tokens that occur."""
    counts = torch.bincount(ids.flatten())
    p = counts[counts > 0].double() / counts.sum()
    return float(-(p * p.log()).sum())


def chart_layout() -> dict[str, dict[str, list]]:
    """The Custom Scalars tab: category -> chart title -> ["Multiline", regular expressions of its tags].

    TensorBoard matches each pattern anywhere in a tag (``loss/train`` would also match ``loss/train_step``),
    so every pattern is anchored: each chart draws exactly the tags its title names.
    """
    return {
        "The chapter's figure": {
            "loss (whole sets, per epoch) and the unigram floor": [
                "Multiline",
                ["^loss/train$", "^loss/val$", "^loss/unigram_baseline$"],
            ],
            "training loss per step (with dropout) and the unigram floor": [
                "Multiline",
                ["^loss/train_step$", "^loss/unigram_baseline$"],
            ],
        },
        "Depth: one line per block": {
            "gradient norm of each block's ffn.fc.weight": ["Multiline", [r"^grad_norm/block_\d+$"]],
            "similarity between positions after each block": ["Multiline", [r"^similarity/block_\d+$"]],
        },
    }


class UnigramBaseline(AfterValidation):
    def __init__(self, chart: bool = True):
        """Log ``loss/unigram_baseline`` (the book's unigram entropy), a flat line: at the start and every validation.

        Computed once from the data module's tokens of the whole book (6.35 nats; the chapter prints 6.346), to
        every logger. Its points sit at the steps of each validation's losses (``loss/train``, ``loss/val``), as
        many as theirs:
        TensorBoard's "Ignore outliers in chart scaling" (on by default) scales a chart to the middle 90% of
        its points, and a floor written at every step would outnumber the losses and shrink the chart to it.

        Args:
            chart: Add the TensorBoard custom-scalars layout (``chart_layout``, the "Custom Scalars" tab): the
                whole-set training and validation losses and this floor on one chart, like the chapter's
                figure; the per-step loss with the floor; every block's gradient norm on one chart; every
                block's similarity between positions on one chart.
        """
        self.chart = chart
        self.value: float | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.value = unigram_entropy(trainer.datamodule.book_ids)
        if self.chart:
            for writer in tensorboard_writers(trainer):
                writer.add_custom_scalars(chart_layout())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if is_fresh_start(trainer):  # the line starts at step 0 (a resumed run logged it before)
            log_scalars(trainer, {"loss/unigram_baseline": self.value}, 0)

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        log_scalars(trainer, {"loss/unigram_baseline": self.value}, validation.step)
