"""The chapter's figures, redrawn after every validation into TensorBoard's Images tab: how each is drawn (the
instruments draw their own), the figure reused from one validation to the next, and ``ChapterFigures`` (the loss
figure)."""

from __future__ import annotations

import math
from typing import Any
from weakref import WeakKeyDictionary

import lightning as L
import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure  # a bare Figure on the Agg canvas: no pyplot, no GUI backend, no global state
from matplotlib.ticker import MaxNLocator
from torch.utils.tensorboard import SummaryWriter

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.tensorboard_log import tensorboard_writers
from gpt_lit.callbacks.unigram import unigram_entropy

# The chapter's figure: train solid, validation dashed, one colour per model kind, the floor dotted black.
RUN_COLOURS = {True: "tab:blue", False: "tab:orange"}  # with residuals / without
RUN_LABELS = {True: "with residuals", False: "without"}
FIGSIZE, DPI = (7.0, 4.0), 100  # 700 x 400 pixels: readable at the Images tab's default size
TITLE = {"fontsize": "medium", "y": 1.0}  # y given: matplotlib skips finding room above the axes


def loss_figure(
    epochs: list[dict[str, Any]], floor: float | None, residual: bool = True, into: ReusedFigure | None = None
) -> Figure:
    """Whole-set training and validation loss at each validation against the training step, the floor dotted."""
    fig, ax = epochs_axes(legend=False, into=into)
    colour, name = RUN_COLOURS[residual], RUN_LABELS[residual]
    for key, style, label in (("train", "-", "train"), ("val", "--", "validation")):
        points = [(e["step"], e[key]) for e in epochs if e.get(key) is not None]
        if points:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, style, color=colour, marker="o", markersize=4, label=f"{name}, {label}")
    if floor is not None:
        ax.axhline(floor, linestyle=":", color="black", linewidth=1.5, label=f"unigram floor {floor:.3f}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("loss (nats)")
    ax.set_title("Loss on the whole training and validation sets, at each validation", **TITLE)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")  # the losses fall from the upper left: that corner stays empty
    return fig


def grad_norm_figure(norms: list[float], step: int, into: ReusedFigure | None = None) -> Figure:
    """Gradient norm of each block's measured weight against the block's depth (the chapter's table as a line)."""
    fig, ax = epochs_axes(legend=False, into=into)
    blocks = list(range(1, len(norms) + 1))
    ax.plot(blocks, norms, "-o", color="tab:green")
    ax.set_xticks(blocks)
    ax.set_ylim(0, 1.2 * max(max(norms), 1e-12))  # headroom: the step's label, top left, stays clear of the points
    ax.set_xlabel("block")
    ax.set_ylabel("gradient norm (L2) of ffn.fc.weight")
    ax.set_title("Gradient norm of each block at the latest training step", **TITLE)  # the same each epoch
    ax.text(0.02, 0.96, f"training step {step}", transform=ax.transAxes, va="top", bbox={"fc": "white", "ec": "none"})
    ax.grid(alpha=0.3)
    return fig


def similarity_figure(
    history: list[dict[str, Any]], into: ReusedFigure | None = None, last: int | None = None
) -> Figure:
    """Similarity between positions against the block's depth, one line per epoch so far (dark: the start), coloured
    on the scale of ``epoch_colour`` up to ``last``."""
    fig, ax = epochs_axes(into=into)
    for point, colour, label in epoch_lines(history, last):
        blocks = list(range(1, len(point["blocks"]) + 1))
        ax.plot(blocks, point["blocks"], "-o", markersize=4, color=colour, label=label)
    if history:
        ax.set_xticks(list(range(1, len(history[0]["blocks"]) + 1)))
    ax.set_ylim(top=1.02)
    title = "Similarity between positions after each block (1: all positions alike)"
    finish_epochs_axes(ax, "block", "mean cosine similarity between positions", title, epochs=(history, last))
    return fig


def epochs_axes(legend: bool = True, into: ReusedFigure | None = None) -> tuple[Figure, Any]:
    """A figure with one axes and, with ``legend``, room at its right for the legend or colour bar; with ``into``,
    that figure's, emptied of what the last epoch drew."""
    if into is not None:
        return into.axes(legend)
    fig = Figure(figsize=FIGSIZE, dpi=DPI)  # a fixed layout: constrained layout doubles the drawing time
    fig.subplots_adjust(left=0.1, right=0.74 if legend else 0.96, bottom=0.12, top=0.91)  # legend: right of the axes
    return fig, fig.add_subplot()


class ReusedFigure:
    """One chart drawn again after every epoch: the same matplotlib Figure and Axes each time, emptied of the lines,
    texts and legend the last epoch drew, so that its axes, ticks and colour bar are not made anew."""

    def __init__(self) -> None:
        self.fig: Figure | None = None
        self.ax: Any = None

    def axes(self, legend: bool) -> tuple[Figure, Any]:
        if self.fig is None:
            self.fig, self.ax = epochs_axes(legend)
            return self.fig, self.ax
        ax = self.ax
        for artist in [*ax.lines, *ax.collections, *ax.texts, *ax.patches, *ax.images]:
            artist.remove()
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        ax.relim()  # no data: the limits follow the next lines, as a new axes' would
        ax.set_autoscale_on(True)
        return self.fig, ax


def run_epochs(trainer: L.Trainer) -> int | None:
    """The run's number of epochs (``trainer.max_epochs``), the end of the figures' colour scale; None if unlimited."""
    return trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs > 0 else None


def epoch_label(epoch: float, step: int | None = None) -> str:
    """A line's name: "start" (``epoch`` 0); "epoch k" for the validation at epoch k's end (``epoch`` k + 1: epochs
    counted from 0, as the progress bar counts); "epoch k, step s" for one within epoch k, at step ``step``."""
    if epoch == 0:
        return "start"
    if epoch == int(epoch):
        return f"epoch {int(epoch) - 1}"
    return f"epoch {math.floor(epoch)}" + (f", step {step}" if step is not None else "")


def last_epoch(history: list[dict[str, Any]], last: int | None) -> int:
    """The end of the colour scale: the run's last epoch (``trainer.max_epochs``), or the history's if later or
    unknown."""
    return math.ceil(max([last or 0, *(point["epoch"] for point in history)]))


def epoch_colour(epoch: float, last: int) -> tuple[float, ...]:
    """The colour of the line measured after ``epoch`` epochs (0: the start; a fraction: within an epoch) on a scale
    from the start (dark) to the run's ``last`` epoch (light): fixed for the whole run, so an epoch has the same
    colour in every image and figure."""
    return colormaps["viridis"](0.9 * epoch / max(last, 1))


def epoch_lines(history: list[dict[str, Any]], last: int | None) -> list[tuple[dict[str, Any], tuple[float, ...], str]]:
    """Each point of ``history`` with its line's colour (``epoch_colour`` up to ``last_epoch``) and name."""
    end = last_epoch(history, last)
    return [(p, epoch_colour(p["epoch"], end), epoch_label(p["epoch"], p.get("step"))) for p in history]


_COLOURBARS: WeakKeyDictionary[Figure, tuple[tuple[int, int, bool], Any]] = WeakKeyDictionary()  # fig: (scale, axes)


def epoch_colourbar(fig: Figure, first: int, last: int, below_legend: bool) -> None:
    """The epochs' colours as a bar right of the axes, one block per epoch from ``first`` to ``last`` (cheaper to
    draw than a legend of a line per epoch); kept in a reused figure while the scale is the same."""
    key = (first, last, below_legend)
    kept = _COLOURBARS.get(fig)
    if kept is not None and kept[0] == key:
        return
    if kept is not None:
        kept[1].remove()
    top = 0.8 if below_legend else 0.91  # below the floor's legend, else as high as the axes
    cax = fig.add_axes((0.775, 0.12, 0.02, top - 0.12))
    epochs = np.arange(first, last + 1)
    cmap = ListedColormap([epoch_colour(int(e), last) for e in epochs])
    bar = fig.colorbar(ScalarMappable(BoundaryNorm(np.arange(first - 0.5, last + 1.5), cmap.N), cmap), cax=cax)
    shown = epochs[:: -(-len(epochs) // 6)]  # at most 6 labelled: start, 1, 3, ... (each label is drawn anew)
    bar.set_ticks(shown, labels=[epoch_label(int(e)).removeprefix("epoch ") for e in shown])
    bar.ax.tick_params(labelsize="small", length=0)
    bar.set_label("epoch", fontsize="small")
    _COLOURBARS[fig] = (key, cax)


def finish_epochs_axes(
    ax: Any,
    xlabel: str,
    ylabel: str,
    title: str,
    floor: float | None = None,
    grid: str = "major",
    epochs: tuple[list[dict[str, Any]], int] | None = None,
):
    """The unigram floor dotted (if given, named in a legend right of the axes), the labels, a light grid, and the
    colour bar of the ``epochs`` (the history drawn and the run's last epoch, as ``epoch_lines`` took them) right
    of the axes."""
    if floor is not None:
        ax.axhline(floor, linestyle=":", color="black", linewidth=1.5, label=f"unigram floor {floor:.3f}")
        ax.legend(handles=ax.lines[-1:], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, **TITLE)
    ax.grid(alpha=0.3, which=grid)
    if epochs is not None and epochs[0]:
        history, last = epochs
        first = math.floor(min(point["epoch"] for point in history))
        epoch_colourbar(ax.figure, first, last_epoch(history, last), floor is not None)


def add_figure(writers: list[SummaryWriter], tag: str, fig: Figure, step: int) -> None:
    """``fig`` into each writer's Images tab as ``tag`` at ``step`` (``SummaryWriter.add_figure``), kept open to be
    drawn again after the next validation."""
    for writer in writers:
        writer.add_figure(tag, fig, step, close=False)


class ChapterFigures(AfterValidation):
    def __init__(self) -> None:
        """Draw the chapter's loss figure into TensorBoard's Images tab after every validation of ``fit``, at the step
        of its ``loss/val``, into every TensorBoard logger the trainer has.

        ``figures/losses``: whole-set training and validation loss at each validation (that validation's own
        results) and the unigram floor (dotted), coloured and labelled like the chapter's figure. Drawn with
        matplotlib's Agg canvas on the main process only; the losses seen so far are kept in checkpoints, so a
        resumed run's figure is whole. The chapter's other two figures come with their instruments, whatever
        the callbacks' order: ``figures/grad_norm_by_block`` (``BlockGradNorms``) and
        ``figures/similarity_by_block`` (``PositionSimilarity``).
        """
        self.epochs: list[dict[str, Any]] = []  # one per validation: {"epoch", "step", "train", "val"}
        self.floor: float | None = None
        self.reused = ReusedFigure()  # the figure, drawn again after each validation

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ids = getattr(trainer.datamodule, "book_ids", None)
        self.floor = unigram_entropy(ids) if ids is not None else None

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        if not trainer.is_global_zero:
            return
        step, results = validation.step, validation.results
        self.epochs.append({"epoch": validation.epoch, "step": step, "train": results.get("loss/train"),
                            "val": results.get("loss/val")})  # fmt: skip
        writers = tensorboard_writers(trainer)
        if not writers:
            return
        residual = bool(getattr(getattr(pl_module.model, "cfg", None), "residual", True))
        add_figure(writers, "figures/losses", loss_figure(self.epochs, self.floor, residual, self.reused), step)

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = list(state_dict.get("epochs", []))
