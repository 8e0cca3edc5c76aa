"""The diagnostics' figures over plain matplotlib (a bare ``Figure`` on the Agg canvas): each line chart one figure,
cleared and drawn again after each validation; the attention image drawn in full once, then blitted."""

import functools
import math
from typing import Any

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, LogFormatter, MaxNLocator, NullLocator

from gpt_lit.measure import octave_means

RUNS = {True: ("tab:blue", "with residuals"), False: ("tab:orange", "without")}  # the chapter's colours and names
TITLE = {"fontsize": "medium", "y": 1.0}  # y given: matplotlib skips finding room above the axes


def when(epoch: float, step: int | None = None, after: bool = False) -> str:
    """When: "start", "epoch k" after epoch k (``epoch`` k + 1), "epoch k, step s" within it; ``after``: "after ..."."""
    if epoch == 0:
        return "at the start" if after else "start"
    if epoch == int(epoch):
        return f"{'after ' if after else ''}epoch {int(epoch) - 1}"
    return f"epoch {math.floor(epoch)}" + (f", step {step}" if step is not None else "")


class Chart:
    """One line chart's 700 x 400 figure, cleared and drawn again after each validation (``axes``)."""

    def __init__(self) -> None:
        self.fig = Figure(figsize=(7.0, 4.0), dpi=100)  # a fixed layout: constrained layout doubles the drawing time

    def axes(self, legend: bool = True) -> Any:
        """The emptied figure's one axes; with ``legend``, room at its right for the legend or colour bar."""
        self.fig.clear()
        self.fig.subplots_adjust(left=0.1, right=0.74 if legend else 0.96, bottom=0.12, top=0.91)
        return self.fig.add_subplot()


def draw_losses(ax: Any, epochs: list[dict[str, Any]], floor: float | None, residual: bool = True) -> None:
    """Whole-set training (solid) and validation (dashed) loss at each validation, the unigram floor dotted."""
    colour, name = RUNS[residual]
    for key, style, label in (("train", "-", "train"), ("val", "--", "validation")):
        if points := [(e["step"], e[key]) for e in epochs if e.get(key) is not None]:
            ax.plot(*zip(*points, strict=True), style, color=colour, marker="o", markersize=4, label=f"{name}, {label}")
    if floor is not None:
        ax.axhline(floor, linestyle=":", color="black", linewidth=1.5, label=f"unigram floor {floor:.3f}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    finish(ax, "training step", "loss (nats)", "Loss on the whole training and validation sets, at each validation")
    ax.legend(loc="upper right", fontsize="small")  # the losses fall from the upper left: that corner stays empty


def draw_grad_norms(ax: Any, norms: list[float], step: int) -> None:
    """Gradient norm of each block's measured weight against the block's depth (the chapter's table as a line)."""
    blocks = list(range(1, len(norms) + 1))
    ax.plot(blocks, norms, "-o", color="tab:green")
    ax.set_xticks(blocks)
    ax.set_ylim(0, 1.2 * max(max(norms), 1e-12))  # headroom: the step's label, top left, stays clear of the points
    ax.text(0.02, 0.96, f"training step {step}", transform=ax.transAxes, va="top", bbox={"fc": "white", "ec": "none"})
    title = "Gradient norm of each block at the latest training step"  # the same each epoch
    finish(ax, "block", "gradient norm (L2) of ffn.fc.weight", title)


def draw_by_block(ax: Any, history: list[dict[str, Any]], last: int | None, kind: str, floor: float | None) -> None:
    """One line per validation of ``point["blocks"]`` against depth: ``kind`` "similarity" or "lens" (floor dotted)."""
    for point, colour, label in epoch_lines(history, last):
        ax.plot(range(1, len(point["blocks"]) + 1), point["blocks"], "-o", markersize=4, color=colour, label=label)
    if history:
        ax.set_xticks(list(range(1, len(history[0]["blocks"]) + 1)))
    if kind == "similarity":
        ax.set_ylim(top=1.02)
        title = "Similarity between positions after each block (1: all positions alike)"
        finish(ax, "block", "mean cosine similarity between positions", title, history=history, last=last)
    else:
        title = "Logit lens: the loss of the stream after each block, read out by the head"
        finish(ax, "stream read out after block", "validation loss (nats)", title, floor, history=history, last=last)


def draw_positions(ax: Any, history: list[dict[str, Any]], floor: float | None, last: int | None) -> None:
    """Validation loss against position (log scale) per validation: each position faint, each octave's mean bold."""
    for point, colour, label in epoch_lines(history, last):
        losses = point["losses"]
        ax.plot(range(1, len(losses) + 1), losses, "-", color=colour, linewidth=0.6, alpha=0.35)
        ax.plot(*octave_means(losses), "-o", color=colour, markersize=4, label=label)
    ax.set_xscale("log", base=2)
    if history:
        n = len(history[0]["losses"])
        ax.xaxis.set_major_locator(FixedLocator([2**k for k in range(11) if 2**k <= n]))
        ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:.0f}")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(1, n)
    title = "Validation loss at each position (faint) and per octave of positions"
    xlabel = "position: tokens of context seen (log scale)"
    finish(ax, xlabel, "validation loss (nats)", title, floor, history=history, last=last)


def draw_stream(ax: Any, history: list[dict[str, Any]], residual: bool, last: int | None) -> None:
    """The stream's RMS against depth (0: the embeddings), one line per validation so far."""
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
    finish(ax, xlabel, "RMS of the stream (log scale)", title, grid="both", history=history, last=last)


def epoch_colour(epoch: float, last: int) -> tuple[float, ...]:
    """The colour of ``epoch`` on a scale from the start (dark) to the run's ``last`` epoch, in every figure."""
    return colormaps["viridis"](0.9 * epoch / max(last, 1))


def last_epoch(history: list[dict[str, Any]], last: int | None) -> int:
    """The end of the colour scale: ``trainer.max_epochs`` (-1 or None: unlimited), or the history's if later."""
    return math.ceil(max([last or 0, *(point["epoch"] for point in history)]))


def epoch_lines(history: list[dict[str, Any]], last: int | None) -> list[tuple[dict[str, Any], tuple, str]]:
    """Each point of ``history`` with its line's colour and name (``when``)."""
    end = last_epoch(history, last)
    return [(p, epoch_colour(p["epoch"], end), when(p["epoch"], p.get("step"))) for p in history]


def finish(ax: Any, xlabel: str, ylabel: str, title: str, floor: float | None = None, grid: str = "major",
           history: list[dict[str, Any]] = (), last: int | None = None) -> None:  # fmt: skip
    """The labels, a grid, the unigram floor dotted (in a legend), the epochs' colours as a bar (cheaper to draw)."""
    if floor is not None:
        ax.axhline(floor, linestyle=":", color="black", linewidth=1.5, label=f"unigram floor {floor:.3f}")
        ax.legend(handles=ax.lines[-1:], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, **TITLE)
    ax.grid(alpha=0.3, which=grid)
    if not history:
        return
    first, last = math.floor(min(point["epoch"] for point in history)), last_epoch(history, last)
    top = 0.8 if floor is not None else 0.91  # below the floor's legend, else as high as the axes
    numbers = np.arange(first, last + 1)
    cmap = ListedColormap([epoch_colour(int(e), last) for e in numbers])
    mappable = ScalarMappable(BoundaryNorm(np.arange(first - 0.5, last + 1.5), cmap.N), cmap)
    bar = ax.figure.colorbar(mappable, cax=ax.figure.add_axes((0.775, 0.12, 0.02, top - 0.12)))
    shown = numbers[:: -(-len(numbers) // 6)]  # at most 6 labelled: start, 1, 3, ...
    bar.set_ticks(shown, labels=[when(int(e)).removeprefix("epoch ") for e in shown])
    bar.ax.tick_params(labelsize="small", length=0)
    bar.set_label("epoch", fontsize="small")


def heads_image(weights: torch.Tensor, gap: int = 2) -> np.ndarray:
    """(n_heads, T, T) weights side by side in one (T, n_heads * (T + gap) - gap) array, NaN (white) elsewhere."""
    n_heads, T = weights.shape[0], weights.shape[-1]
    image = np.full((T, n_heads * (T + gap) - gap), np.nan)
    past = np.tri(T, dtype=bool)  # the keys up to each query; the masked future stays NaN
    for h in range(n_heads):
        image[:, h * (T + gap) : h * (T + gap) + T] = np.where(past, weights[h].float().numpy(), np.nan)
    return image


def attention_title(block: int) -> str:
    return f"Block {block}: where each token (row) looks among the tokens up to it (columns)"


@functools.cache
def text_inches(text: str) -> float:
    """The width, in inches, of ``text`` in the figure's title font (matplotlib's "large")."""
    scratch = FigureCanvasAgg(Figure(dpi=100)).figure  # on an Agg canvas, as add_figure draws
    return scratch.text(0, 0, text, fontsize="large").get_window_extent(scratch.canvas.get_renderer()).width / 100


def attention_figure(weights: torch.Tensor, labels: list[str], block: int, epoch: float, step: int | None = None):
    """One block's (n_heads, T, T) weights, queries down, keys across, tokens as plain texts (cheaper than ticks)."""
    n_heads, T = weights.shape[0], weights.shape[-1]
    gap, cell = 2, 0.15  # blank columns between heads, inches per token
    image = heads_image(weights, gap)
    left, right, top, bottom = 1.0, 1.1, 0.7, 1.0
    widest_when = max(text_inches(when(999, after=True)), text_inches(when(998.5, 999_999)))
    band = max(image.shape[1] * cell, text_inches(attention_title(99)) + 0.3 + widest_when)  # room for both texts
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
    fig.text(1 - right / width, top, when(epoch, step, after=True), ha="right", va="top", fontsize="large")
    return fig


class AttentionChart:
    """``attention_figure`` drawn once without its weights and texts, then only those on the saved rest (blitting)."""

    def __init__(self, labels: list[str], n_heads: int):
        T = len(labels)
        self.fig = attention_figure(torch.full((n_heads, T, T), 1.0 / T), labels, block=1, epoch=0)
        self.canvas = FigureCanvasAgg(self.fig)
        self.changing = [self.fig.axes[0].images[0], *self.fig.texts]  # the weights, the title, when
        for artist in self.changing:
            artist.set_animated(True)  # left out of the full draw
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(self.fig.bbox)

    def pixels(self, weights: torch.Tensor, block: int, epoch: float, step: int | None = None) -> np.ndarray:
        """The figure of ``block``'s weights (n_heads, T, T) after ``epoch`` epochs, (height, width, 3) uint8 RGB."""
        image, title, said = self.changing
        image.set_data(heads_image(weights))
        title.set_text(attention_title(block))
        said.set_text(when(epoch, step, after=True))
        self.canvas.restore_region(self.background)
        for artist in self.changing:
            self.fig.draw_artist(artist)
        return np.asarray(self.canvas.buffer_rgba())[:, :, :3].copy()
