"""The unigram floor as a scalar, and TensorBoard's Custom Scalars tab: the charts that put several tags on one plot
(the chapter's loss figure, one line per block)."""

from __future__ import annotations

import lightning as L

from gpt_lit.diagnostics.probe import ValidationStep, log_at, tensorboards


def chart_layout() -> dict[str, dict[str, list]]:
    """The Custom Scalars tab: category -> chart title -> ["Multiline", regular expressions of its tags]. TensorBoard
    matches a pattern anywhere in a tag (``loss/train`` would match ``loss/train_step``): every pattern is anchored."""
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


class UnigramBaseline(ValidationStep):
    def __init__(self, chart: bool = True):
        """Log ``loss/unigram_baseline`` (the book's unigram entropy), a flat line: at the start and every validation.

        The data module's ``unigram_floor``, computed once from the tokens of the whole book (6.35 nats; the chapter
        prints 6.346), to every logger. Its points sit at the steps of each validation's losses, as many as theirs:
        TensorBoard's "Ignore outliers in chart scaling" (on by default) scales a chart to the middle 90% of its
        points, and a floor written at every step would outnumber the losses and shrink the chart to it.

        Args:
            chart: Add TensorBoard's "Custom Scalars" layout (``chart_layout``): the whole-set training and validation
                losses and this floor on one chart, like the chapter's figure; the per-step loss with the floor; every
                block's gradient norm on one chart; every block's similarity between positions on one chart.
        """
        self.chart = chart

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for writer in tensorboards(trainer) if self.chart else []:
            writer.add_custom_scalars(chart_layout())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is None:  # the line starts at step 0 (a resumed run logged it before)
            log_at(trainer, {"loss/unigram_baseline": trainer.datamodule.unigram_floor}, 0)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.fitting(trainer):
            pl_module.log("loss/unigram_baseline", trainer.datamodule.unigram_floor, sync_dist=True)
