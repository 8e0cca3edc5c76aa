"""Position similarity: do the positions of a sequence still differ after each block of the stack?"""

from __future__ import annotations

import lightning as L

from gpt_lit.diagnostics.figures import Chart, draw_by_block
from gpt_lit.diagnostics.probe import Probe, run_epochs, show
from gpt_lit.measure import position_similarity, record_blocks


class PositionSimilarity(Probe):
    def __init__(self, num_sequences: int = 4, figure: bool = True):
        """Log the similarity between positions after every block, at the start of training and after every validation.

        The mean cosine similarity between the output vectors of different positions of a sequence
        (``measure.position_similarity``), over the first ``num_sequences`` validation windows (a fixed batch),
        without dropout and without gradients: ``similarity/block_1`` ... ``similarity/block_N`` at the output of
        each block, and ``similarity/positions`` at the top of the stack (before the final norm; equal to block_N),
        the chapter's number: 0.563 with residuals, 1.000 without (12 blocks, untrained). Each validation's values at
        the step of its ``loss/val``, to every logger. With ``figure``, after every validation the image
        ``figures/similarity_by_block``: the similarity against depth, one line per measurement so far (the start
        included). Skipped, with one logged line, under strategies that shard the parameters.

        Args:
            num_sequences: How many validation windows to average over (a fixed batch).
            figure: Draw the figure too (else the scalars only).
        """
        super().__init__(num_sequences)
        self.figure = figure
        self.chart = Chart()

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        record = record_blocks(pl_module.model, self.batch(pl_module)[0])
        blocks = [position_similarity(out).mean().item() for out in record.block_out]
        self.history.append({"step": step, "epoch": epoch, "blocks": blocks})  # epoch 0: the start
        if self.figure and epoch > 0:  # after a validation (the start is drawn with the first)
            last = run_epochs(trainer)
            show(trainer, "figures/similarity_by_block", step, self.chart,
                 lambda ax: draw_by_block(ax, self.history, last, "similarity", None))  # fmt: skip
        return {**{f"similarity/block_{i}": v for i, v in enumerate(blocks, 1)}, "similarity/positions": blocks[-1]}
