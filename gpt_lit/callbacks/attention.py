"""Attention, per head: what each position of a fixed sentence looks at, and how spread out the heads' rows are."""

from __future__ import annotations

import functools
import math
from typing import Any

import lightning as L
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gpt_lit.callbacks.block_pass import BlockRecord, record_blocks
from gpt_lit.callbacks.probe import ValidationProbe
from gpt_lit.callbacks.tensorboard_log import log_scalars, tensorboard_writers
from gpt_lit.model import GPT
from gpt_lit.tokenizer import get_tokenizer


@torch.no_grad()
def block_attentions(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """The attention weights of every block, (B, n_heads, T, T) each, for the token IDs ``idx`` (B, T).

    One pass of ``model.hidden_states`` that records each block's attention input (``record_blocks``); in
    whatever mode the model is in (the callback puts it in eval mode).
    """
    return recorded_attentions(model, record_blocks(model, idx))


def recorded_attentions(model: GPT, record: BlockRecord) -> list[torch.Tensor]:
    """The attention weights of every block (``CausalSelfAttention.weights``) from the attention inputs a pass
    recorded."""
    return [blk.attn.weights(x) for blk, x in zip(model.blocks, record.attn_x, strict=True)]


def row_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy, in nats, of each attention row: -sum_j w_j log w_j (0 log 0 = 0). (..., T, T) -> (..., T)."""
    return -torch.special.xlogy(weights, weights).sum(dim=-1)


def token_labels(ids: list[int]) -> list[str]:
    """Each token as text for an axis label: a line break as ↵, at most 12 characters."""
    enc = get_tokenizer()
    return [enc.decode([i]).replace("\n", "↵")[:12] for i in ids]


def heads_image(weights: torch.Tensor, gap: int = 2) -> np.ndarray:
    """(n_heads, T, T) weights as one (T, n_heads * (T + gap) - gap) array, heads side by side, NaN (white) in the
    masked future and in the ``gap`` columns between heads."""
    n_heads, T = weights.shape[0], weights.shape[-1]
    image = np.full((T, n_heads * (T + gap) - gap), np.nan)
    for h in range(n_heads):
        head = weights[h].float().numpy().copy()
        head[np.triu_indices(T, 1)] = np.nan  # the masked future: white
        image[:, h * (T + gap) : h * (T + gap) + T] = head
    return image


def attention_title(block: int) -> str:
    return f"Block {block}: where each token (row) looks among the tokens up to it (columns)"


def attention_when(epoch: float, step: int | None = None) -> str:
    """When the weights were measured: "at the start", "after epoch k" (``epoch`` k + 1: epochs count from 0, as the
    progress bar counts), or "epoch k, step s" for a validation within epoch k."""
    if epoch == 0:
        return "at the start"
    if epoch == int(epoch):
        return f"after epoch {int(epoch) - 1}"
    return f"epoch {math.floor(epoch)}" + (f", step {step}" if step is not None else "")


def attention_figure(weights: torch.Tensor, labels: list[str], block: int, epoch: float) -> Figure:
    """One block's heads side by side: (n_heads, T, T) weights, queries down, keys across, the tokens as labels.

    One image of all heads (white: the masked future) and plain text labels, no tick objects or constrained
    layout: a hundred tick objects would cost most of a figure's drawing time (docs/performance.md), and
    ``AttentionFigure`` redraws it for each block and epoch from saved pixels.
    """
    n_heads, T = weights.shape[0], weights.shape[-1]
    gap = 2  # blank columns between heads
    image = heads_image(weights, gap)
    cell = 0.15  # inches per token
    left, right, top, bottom = 1.0, 1.1, 0.7, 1.0
    # The band over the image: the title from its left end, when the weights were measured up to its right end, or
    # further right where the image (a short sentence, few heads) is narrower than the widest of both and a gap.
    band = max(image.shape[1] * cell, text_inches(WIDEST_TITLE) + 0.3 + max(map(text_inches, WIDEST_WHEN)))
    width, height = left + band + right, top + T * cell + bottom
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_axes((left / width, bottom / height, image.shape[1] * cell / width, T * cell / height))
    shown = ax.imshow(image, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
    ax.set_axis_off()
    for h in range(n_heads):
        x0 = h * (T + gap)
        ax.text(x0 + (T - 1) / 2, -0.8, f"head {h + 1}", ha="center", va="bottom")
        for j, label in enumerate(labels):
            ax.text(x0 + j, T - 0.3, label, rotation=90, ha="center", va="top", fontsize=7)
    for j, label in enumerate(labels):
        ax.text(-0.8, j, label, ha="right", va="center", fontsize=7)
    bar_left = left + image.shape[1] * cell + 0.25  # right of the image
    cax = fig.add_axes((bar_left / width, bottom / height, 0.15 / width, T * cell / height))
    fig.colorbar(shown, cax=cax, label="attention weight")
    top = 1 - 0.1 / height
    fig.text(left / width, top, attention_title(block), va="top", fontsize="large")  # the title, over the image
    fig.text(1 - right / width, top, attention_when(epoch), ha="right", va="top", fontsize="large")  # when, at its end
    return fig


# The widest title and texts of when the weights were measured (at an epoch's end, within one) that the figure
# makes room for: up to 99 blocks, 999 epochs and a million steps.
WIDEST_TITLE = attention_title(99)
WIDEST_WHEN = (attention_when(999), attention_when(998.5, 999_999))


@functools.cache
def text_inches(text: str) -> float:
    """The width, in inches, of ``text`` in the figure's title font (matplotlib's "large")."""
    scratch = Figure(dpi=100)
    renderer = FigureCanvasAgg(scratch).get_renderer()
    return scratch.text(0, 0, text, fontsize="large").get_window_extent(renderer).width / 100


class AttentionFigure:
    """``attention_figure`` drawn in full once; each later image, of any block and epoch, is put together from saved
    pixels: the rest of the figure (labels, layout, colour bar: the same for every block and epoch), the block's
    title (drawn once per block), the epoch's "after epoch k" (drawn once per epoch) and the weights, painted with
    numpy: each token's cell ``cell`` x ``cell`` pixels of its colour from the image's own colour map and scale
    (white where the mask hides the future), the nearest-neighbour picture Agg would resample, at a fraction of
    its cost (docs/performance.md). A title or "when" wider than the figure made room for (block 100, epoch
    1,000 on) would cross the column between them: then both are drawn for that image (matplotlib's blitting:
    ``restore_region``, ``draw_artist``). The pixels equal a full draw's (tests check)."""

    def __init__(self, weights: torch.Tensor, labels: list[str]):
        self.fig = attention_figure(weights, labels, block=1, epoch=0)
        self.canvas = FigureCanvasAgg(self.fig)
        self.image = self.fig.axes[0].images[0]
        self.title, self.when = self.fig.texts  # the figure's own texts: the title and when it was measured
        for artist in (self.image, self.title, self.when):
            artist.set_visible(False)
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(self.fig.bbox)  # everything but the weights and the two texts
        self.base = self.rgb()
        for artist in (self.image, self.title, self.when):
            artist.set_visible(True)
        x0, y0, x1, y1 = self.fig.axes[0].get_window_extent().extents  # the image's pixels, from the bottom left
        height = self.canvas.get_width_height()[1]
        self.rows = slice(round(height - y1), round(height - y0))  # from the top, as the buffer's rows
        self.cols = slice(round(x0), round(x1))
        n_rows, n_cols = heads_image(weights).shape
        self.cell = (self.rows.stop - self.rows.start) // n_rows  # pixels per token
        if (n_rows * self.cell, n_cols * self.cell) != (
            self.rows.stop - self.rows.start,
            self.cols.stop - self.cols.start,
        ):
            raise ValueError("the attention image does not cover a whole number of pixels per token")
        # The column where the title's part of the top band ends and the epoch's begins: the middle of the gap that
        # attention_figure leaves between the widest title and the widest "after epoch" or "epoch k, step s".
        renderer = self.canvas.get_renderer()
        self.title.set_text(WIDEST_TITLE)
        title_end, when_start = self.title.get_window_extent(renderer).x1, math.inf
        for widest in WIDEST_WHEN:
            self.when.set_text(widest)
            when_start = min(when_start, self.when.get_window_extent(renderer).x0)
        self.split = round((title_end + when_start) / 2)
        self.titles: dict[int, np.ndarray | None] = {}  # block: the top band's pixels up to ``split``, with its title
        self.whens: tuple[str, np.ndarray | None] | None = None  # (when, the top band's pixels from ``split``)

    def rgb(self) -> np.ndarray:
        return np.asarray(self.canvas.buffer_rgba())[:, :, :3].copy()

    def band(self, text: Any, value: str, left: bool) -> np.ndarray | None:
        """The pixels above the image left of ``split`` (``left``) or from it, with ``text`` saying ``value`` over the
        rest; None where the text reaches past ``split`` (wider than the widest the figure made room for: block 100,
        epoch 1,000 on)."""
        text.set_text(value)
        box = text.get_window_extent(self.canvas.get_renderer())
        if box.x1 >= self.split if left else box.x0 <= self.split:
            return None
        self.canvas.restore_region(self.background)
        self.fig.draw_artist(text)
        columns = slice(0, self.split) if left else slice(self.split, None)
        return np.asarray(self.canvas.buffer_rgba())[: self.rows.start, columns, :3].copy()

    def painted(self, weights: torch.Tensor) -> np.ndarray:
        """The image's pixels for ``weights`` (n_heads, T, T): (T * cell, width * cell, 3) uint8 RGB."""
        values = heads_image(weights)
        rgb = self.image.to_rgba(values, bytes=True)[:, :, :3]  # its colour map and vmin/vmax, as imshow's
        rgb[np.isnan(values)] = 255  # the masked future and the gaps: the white axes behind the image
        return rgb.repeat(self.cell, axis=0).repeat(self.cell, axis=1)

    def pixels(self, weights: torch.Tensor, block: int, epoch: float, step: int | None = None) -> np.ndarray:
        """The figure for ``block``'s ``weights`` (n_heads, T, T) after ``epoch`` epochs (0: the start; a fraction:
        the validation at ``step``, within an epoch), (height, width, 3) uint8 RGB."""
        when = attention_when(epoch, step)
        if block not in self.titles:
            self.titles[block] = self.band(self.title, attention_title(block), left=True)
        if self.whens is None or self.whens[0] != when:
            self.whens = (when, self.band(self.when, when, left=False))
        if self.titles[block] is None or self.whens[1] is None:  # a text past the room made for it
            self.title.set_text(attention_title(block))
            self.when.set_text(when)
            self.canvas.restore_region(self.background)
            self.fig.draw_artist(self.title)
            self.fig.draw_artist(self.when)
            out = self.rgb()
        else:
            out = self.base.copy()
            out[: self.rows.start, : self.split] = self.titles[block]
            out[: self.rows.start, self.split :] = self.whens[1]
        out[self.rows, self.cols] = self.painted(weights)
        return out


@functools.lru_cache(maxsize=4)
def attention_figure_for(labels: tuple[str, ...], n_heads: int) -> AttentionFigure:
    """The ``AttentionFigure`` of a sentence's ``labels`` and ``n_heads`` heads, made once a process: its layout
    and saved pixels depend on nothing else (the weights are painted for each image), and making one draws a whole
    figure. A notebook's second run, or a test session's hundred, reuse it."""
    T = len(labels)
    return AttentionFigure(torch.full((n_heads, T, T), 1.0 / T), list(labels))


class AttentionMaps(ValidationProbe):
    def __init__(self, num_tokens: int = 24, num_sequences: int = 4):
        """Draw each block's attention weights for one fixed sentence, and log how sharp the heads are.

        Images ``attention/block_1`` ... ``block_N``: for the first ``num_tokens`` tokens of the first validation
        window, every head of the block side by side, a row per token (query), a column per token it may look
        at (keys up to it), the tokens as labels. Scalars ``attention/entropy/block_1`` ... ``block_N``: the mean
        entropy, in nats, of the attention rows over every head, position and the first ``num_sequences``
        validation windows (a fixed batch); lower is sharper (a row that looks at one token has 0, a row
        spread evenly over t tokens has log t). At the start of a fresh run and after every validation of
        ``fit``, at the step of its ``loss/val``, on the main process, in eval mode without gradients; the scalars
        to every logger, the images to every TensorBoard logger. The weights are
        softmax(Q K^T / sqrt(head_dim) + mask), written out by each block's attention (``CausalSelfAttention.weights``).
        Skipped, with one logged line, under strategies that shard the parameters.

        Args:
            num_tokens: How many tokens of the first validation window the images show.
            num_sequences: How many validation windows the entropy averages over.
        """
        super().__init__(num_sequences)
        self.num_tokens = num_tokens
        self.labels: list[str] = []

    def prepare(self, trainer: L.Trainer) -> None:
        self.labels = token_labels(self.batch[0, : self.num_tokens].tolist())

    def measure(self, model: GPT, batch: torch.Tensor) -> tuple[list[torch.Tensor], list[float]]:
        """Per block: the sentence's weights (n_heads, num_tokens, num_tokens) and the fixed batch's mean entropy.

        One pass: the sentence opens the batch's first window, and the mask keeps its first tokens' rows from
        looking past them, so its weights are that window's top-left corner."""
        weights = recorded_attentions(model, self.blocks(model, batch))  # as block_attentions, from the shared pass
        n = self.num_tokens
        return [w[0, :, :n, :n].cpu() for w in weights], [row_entropy(w).mean().item() for w in weights]

    def record(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float, values: tuple) -> None:
        sentence, entropies = values
        log_scalars(trainer, {f"attention/entropy/block_{i}": v for i, v in enumerate(entropies, 1)}, step)
        writers = tensorboard_writers(trainer)
        if writers:
            figure = attention_figure_for(tuple(self.labels), n_heads=len(sentence[0]))  # drawn in full once
            for i, weights in enumerate(sentence, 1):
                pixels = figure.pixels(weights, i, epoch, step)
                for writer in writers:
                    writer.add_image(f"attention/block_{i}", pixels, step, dataformats="HWC")
