"""The chapter's loss figure: as an image, its unigram floor as a scalar, and as a chart of TensorBoard's Custom
Scalars tab (with one line per block of the gradient norms and the similarity)."""

from typing import Any

import lightning as L

from gpt_lit.diagnostics.figures import Chart, draw_losses
from gpt_lit.diagnostics.probe import ValidationStep, log_at, show, tensorboards


class ChapterFigures(ValidationStep):
    def __init__(self) -> None:
        """Image ``figures/losses`` after every validation of ``fit``: the whole-set training and validation losses
        so far (the module's ``last_validation``, kept in checkpoints) and the unigram floor, as the chapter draws
        them."""
        self.epochs: list[dict[str, Any]] = []  # one per validation: {"epoch", "step", "train", "val"}
        self.chart = Chart()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the module's on_validation_epoch_end: its results are this validation's.
        if not self.fitting(trainer) or not trainer.is_global_zero:
            return
        results = getattr(pl_module, "last_validation", None) or {}
        self.epochs.append({"epoch": self.epoch, "step": self.step, "train": results.get("loss/train"),
                            "val": results.get("loss/val")})  # fmt: skip
        floor, residual = getattr(trainer.datamodule, "unigram_floor", None), pl_module.model.cfg.residual
        show(trainer, "figures/losses", self.step, self.chart,
             lambda ax: draw_losses(ax, self.epochs, floor, residual), legend=False)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = list(state_dict.get("epochs", []))


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
        """Scalar ``loss/unigram_baseline``: the data module's ``unigram_floor`` (the book's unigram entropy), at step
        0 and beside each validation's losses only (as many points as theirs: TensorBoard's outlier-ignoring scale
        keeps the chart on the losses).

        Args:
            chart: Add TensorBoard's Custom Scalars layout (``chart_layout``).
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
