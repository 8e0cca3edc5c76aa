"""The unigram-entropy floor: the loss of a model that ignores context and predicts token frequencies."""

from __future__ import annotations

import lightning as L
import torch

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.custom_scalars import add_chart_layout
from gpt_lit.callbacks.tensorboard_log import is_fresh_start, log_scalars


def unigram_entropy(ids: torch.Tensor) -> float:
    """Entropy, in nats, of the token frequencies in ``ids``: -sum p log p over the tokens that occur."""
    counts = torch.bincount(ids.flatten())
    p = counts[counts > 0].double() / counts.sum()
    return float(-(p * p.log()).sum())


class UnigramBaseline(AfterValidation):
    def __init__(self, chart: bool = True):
        """Log ``loss/unigram_baseline`` (the book's unigram entropy), a flat line: at the start and every validation.

        Computed once from the data module's tokens of the whole book (6.35 nats; the chapter prints 6.346), to
        every logger. Its points sit at the steps of each validation's losses (``loss/train``, ``loss/val``), as
        many as theirs:
        TensorBoard's "Ignore outliers in chart scaling" (on by default) scales a chart to the middle 90% of
        its points, and a floor written at every step would outnumber the losses and shrink the chart to it.

        Args:
            chart: Add TensorBoard's "Custom Scalars" layout (gpt_lit/callbacks/custom_scalars.py): the whole-set
                training and validation losses and this floor on one chart, like the chapter's figure; the
                per-step loss with the floor; every block's gradient norm on one chart; every block's similarity
                between positions on one chart.
        """
        self.chart = chart
        self.value: float | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.value = unigram_entropy(trainer.datamodule.book_ids)
        if self.chart:
            add_chart_layout(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if is_fresh_start(trainer):  # the line starts at step 0 (a resumed run logged it before)
            log_scalars(trainer, {"loss/unigram_baseline": self.value}, 0)

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        log_scalars(trainer, {"loss/unigram_baseline": self.value}, validation.step)
