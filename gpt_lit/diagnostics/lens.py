"""The logit lens: what the stream after each block would predict, read out through the final norm and the head."""

from __future__ import annotations

import lightning as L

from gpt_lit.diagnostics.figures import Chart, draw_by_block
from gpt_lit.diagnostics.probe import Probe, run_epochs, show
from gpt_lit.measure import lens_losses, record_blocks


class LogitLens(Probe):
    at_start = False  # the head reads nothing useful before training

    def __init__(self, num_sequences: int = 2):
        """Log the validation loss of the stream after each block, read out through the final norm and the head.

        ``lens/block_1`` ... ``block_N``: the cross-entropy on the first ``num_sequences`` validation windows (a fixed
        batch) when the model's output head reads the stream after block i (through the final norm) instead of after
        the last block (``measure.lens_losses``); ``block_N`` is the model's own loss on those windows. After every
        validation of ``fit``, at the step of its ``loss/val``, to every logger, in eval mode without gradients. The
        image ``figures/lens_by_block`` draws the loss against depth, one line per validation, with the unigram floor
        dotted. Each depth costs one pass of the output head (vocab_size x emb_dim) over the batch. Skipped, with one
        logged line, under strategies that shard the parameters.

        Args:
            num_sequences: How many validation windows to measure on (a fixed batch).
        """
        super().__init__(num_sequences)
        self.chart = Chart()

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        x, y = self.batch(pl_module)
        blocks = lens_losses(pl_module.model, record_blocks(pl_module.model, x), y).flatten(1).mean(dim=1).tolist()
        self.history.append({"step": step, "epoch": epoch, "blocks": blocks})
        last, floor = run_epochs(trainer), getattr(trainer.datamodule, "unigram_floor", None)
        show(trainer, "figures/lens_by_block", step, self.chart,
             lambda ax: draw_by_block(ax, self.history, last, "lens", floor))  # fmt: skip
        return {f"lens/block_{i}": v for i, v in enumerate(blocks, 1)}
