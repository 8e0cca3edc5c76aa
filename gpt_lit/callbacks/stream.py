"""The residual stream: how large it is after each block, and how much each sub-layer writes into it."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from gpt_lit.callbacks.block_pass import BlockRecord, record_blocks
from gpt_lit.callbacks.figures import ReusedFigure, add_figure, epoch_lines, epochs_axes, finish_epochs_axes, run_epochs
from gpt_lit.callbacks.probe import ValidationProbe
from gpt_lit.callbacks.tensorboard_log import log_scalars, tensorboard_writers
from gpt_lit.model import GPT


def rms(x: torch.Tensor) -> float:
    """Root-mean-square of every number of ``x``: sqrt(mean(x^2))."""
    return x.float().square().mean().sqrt().item()


@torch.no_grad()
def stream_sizes(model: GPT, idx: torch.Tensor) -> dict[str, Any]:
    """The stream's RMS into and out of every block, and each sub-layer's output RMS over its input stream's.

    One pass of ``model.hidden_states`` on the token IDs ``idx`` (B, T), with forward hooks (``record_blocks``)
    that read, in each block, the stream the attention reads (``norm1``'s input), the attention's output, the
    stream the feed-forward reads (``norm2``'s input) and the feed-forward's output. Returns ``embeddings`` (the RMS of
    the stream entering block 1), ``rms`` (after each block), ``attn`` and ``ffn`` (per block: RMS of the
    sub-layer's output / RMS of the stream it is added to; without residuals, of the stream it replaces).
    In whatever mode the model is in (dropout, if training, would sit between the branch and the sum).
    """
    return sizes(record_blocks(model, idx))


def sizes(record: BlockRecord) -> dict[str, Any]:
    """``stream_sizes`` from what a pass recorded."""
    return {
        "embeddings": rms(record.attn_in[0]),
        "rms": [rms(out) for out in record.block_out],
        "attn": [rms(out) / rms(x) for out, x in zip(record.attn_out, record.attn_in, strict=True)],
        "ffn": [rms(out) / rms(x) for out, x in zip(record.ffn_out, record.ffn_in, strict=True)],
    }


def stream_figure(
    history: list[dict[str, Any]], residual: bool, into: ReusedFigure | None = None, last: int | None = None
) -> Figure:
    """The stream's RMS against depth (0: the embeddings), one line per validation so far (coloured by ``epoch_lines``
    up to ``last``; dark: the start)."""
    fig, ax = epochs_axes(into=into)
    for point, colour, label in epoch_lines(history, last):
        sizes = [point["embeddings"], *point["rms"]]
        ax.plot(range(len(sizes)), sizes, "-o", markersize=4, color=colour, label=label)
    if history:
        depth = len(history[0]["rms"])
        ax.set_xticks(range(depth + 1), ["embed", *map(str, range(1, depth + 1))])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter("{x:g}")  # "0.1", not "10^-1" or "1e-01": narrow enough for the axis label
    ax.yaxis.set_minor_formatter(LogFormatter())  # minor ticks labelled only where the axis spans under a decade
    kind = "the residual stream" if residual else "the stream (no residuals: each block's output)"
    title, xlabel = f"Size of {kind} after each block", "after block (embed: the stream entering block 1)"
    finish_epochs_axes(ax, xlabel, "RMS of the stream (log scale)", title, grid="both", epochs=(history, last))
    return fig


class ResidualStream(ValidationProbe):
    def __init__(self, num_sequences: int = 4):
        """Log the size of the residual stream after each block, and how much each sub-layer writes into it.

        On the first ``num_sequences`` validation windows (a fixed batch), in eval mode without gradients, at the start
        of a fresh run and after every validation of ``fit``, at the step of its ``loss/val``, to every logger, on the
        main process: ``stream/rms/block_1`` ... ``block_N``, the root-mean-square of the stream after each block
        (``stream/rms/embeddings``: entering block 1); ``stream/update/attn_i`` and ``stream/update/ffn_i``, the RMS of
        the sub-layer's output over the RMS of the stream it is added to (0.1: it nudges the stream; 1: it writes as
        much as is there). Without residuals nothing is added: the sub-layer's output *is* the next stream, and the
        ratio is its output's size over its input's. The image ``figures/stream_by_block`` (to every TensorBoard logger)
        draws the stream's size against depth, one line per validation. Skipped, with one logged line, under strategies
        that shard the parameters.

        Args:
            num_sequences: How many validation windows to measure on (a fixed batch).
        """
        super().__init__(num_sequences)
        self.reused = ReusedFigure()  # the figure, drawn again after each validation

    def measure(self, model: GPT, batch: torch.Tensor) -> dict[str, Any]:
        return sizes(self.blocks(model, batch))  # as stream_sizes, from the shared pass

    def record(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float, sizes: dict) -> None:
        self.history.append({"step": step, "epoch": epoch, **sizes})  # "embeddings", "rms", "attn", "ffn"
        metrics = {"stream/rms/embeddings": sizes["embeddings"]}
        for i in range(len(sizes["rms"])):
            metrics[f"stream/rms/block_{i + 1}"] = sizes["rms"][i]
            metrics[f"stream/update/attn_{i + 1}"] = sizes["attn"][i]
            metrics[f"stream/update/ffn_{i + 1}"] = sizes["ffn"][i]
        log_scalars(trainer, metrics, step)
        writers = tensorboard_writers(trainer)
        if writers:
            residual = bool(getattr(getattr(pl_module.model, "cfg", None), "residual", True))
            fig = stream_figure(self.history, residual, self.reused, run_epochs(trainer))
            add_figure(writers, "figures/stream_by_block", fig, step)
