"""TensorBoard's Custom Scalars tab: the charts that put several tags on one plot (the chapter's loss figure, one
line per block)."""

from __future__ import annotations

import lightning as L

from gpt_lit.callbacks.tensorboard_log import tensorboard_writers


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


def add_chart_layout(trainer: L.Trainer) -> None:
    """Write ``chart_layout`` to every TensorBoard writer of ``trainer`` (none on the other processes)."""
    for writer in tensorboard_writers(trainer):
        writer.add_custom_scalars(chart_layout())
