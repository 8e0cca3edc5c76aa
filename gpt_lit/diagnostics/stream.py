"""The residual stream: how large it is after each block, and how much each sub-layer writes into it."""

from __future__ import annotations

import lightning as L

from gpt_lit.diagnostics.figures import Chart, draw_stream
from gpt_lit.diagnostics.probe import Probe, run_epochs, show
from gpt_lit.measure import batch_rms, record_blocks, stream_sizes, token_rms, update_ratios


class ResidualStream(Probe):
    def __init__(self, num_sequences: int = 4):
        """Log the size of the residual stream after each block, and how much each sub-layer writes into it.

        On the first ``num_sequences`` validation windows (a fixed batch), in eval mode without gradients, at the start
        of a fresh run and after every validation of ``fit``, at the step of its ``loss/val``, to every logger:
        ``stream/rms/block_1`` ... ``block_N``, the root-mean-square of the stream after each block
        (``stream/rms/embeddings``: entering block 1); ``stream/update/attn_i`` and ``stream/update/ffn_i``, the RMS of
        the sub-layer's output over the RMS of the stream it is added to (0.1: it nudges the stream; 1: it writes as
        much as is there; ``measure.update_ratios``). Without residuals nothing is added: the sub-layer's output *is*
        the next stream, and the ratio is its output's size over its input's. The image ``figures/stream_by_block``
        draws the stream's size against depth, one line per validation. Skipped, with one logged line, under
        strategies that shard the parameters.

        Args:
            num_sequences: How many validation windows to measure on (a fixed batch).
        """
        super().__init__(num_sequences)
        self.chart = Chart()

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        record = record_blocks(pl_module.model, self.batch(pl_module)[0])
        sizes = {"embeddings": batch_rms(token_rms(record.attn_in[0])).item(),
                 "rms": batch_rms(stream_sizes(record)).tolist(),
                 **dict(zip(("attn", "ffn"), (r.tolist() for r in update_ratios(record)), strict=True))}  # fmt: skip
        self.history.append({"step": step, "epoch": epoch, **sizes})
        last, residual = run_epochs(trainer), pl_module.model.cfg.residual
        show(trainer, "figures/stream_by_block", step, self.chart,
             lambda ax: draw_stream(ax, self.history, residual, last))  # fmt: skip
        metrics = {"stream/rms/embeddings": sizes["embeddings"]}
        for i in range(len(sizes["rms"])):
            metrics[f"stream/rms/block_{i + 1}"] = sizes["rms"][i]
            metrics[f"stream/update/attn_{i + 1}"] = sizes["attn"][i]
            metrics[f"stream/update/ffn_{i + 1}"] = sizes["ffn"][i]
        return metrics
