"""The chapter's loss figure in TensorBoard's Images tab."""

from __future__ import annotations

from typing import Any

import lightning as L

from gpt_lit.diagnostics.figures import Chart, draw_losses
from gpt_lit.diagnostics.probe import ValidationStep, show


class ChapterFigures(ValidationStep):
    def __init__(self) -> None:
        """Draw the chapter's loss figure into TensorBoard's Images tab after every validation of ``fit``, at the step
        of its ``loss/val``, into every TensorBoard logger the trainer has.

        ``figures/losses``: whole-set training and validation loss at each validation (the module's
        ``last_validation``) and the unigram floor (dotted), coloured and labelled like the chapter's figure. The
        losses seen so far are kept in checkpoints, so a resumed run's figure is whole. The chapter's other two
        figures come with their diagnostics: ``figures/grad_norm_by_block`` (``BlockGradNorms``) and
        ``figures/similarity_by_block`` (``PositionSimilarity``).
        """
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
