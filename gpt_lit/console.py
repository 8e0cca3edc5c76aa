"""What a run prints: Lightning's progress bar, model summary and losses, without the dependencies' noise.

Three messages are dropped, each matched exactly (every other warning and log line still shows):

- Lightning's "💡 Tip: For seamless cloud logging ... try installing litlogger" advertisement, at every start;
- PyTorch's "`isinstance(treespec, LeafSpec)` is deprecated" FutureWarning, which Lightning's own
  ``_pytree`` helper triggers once in every process;
- Lightning's CSVLogger's "Experiment logs directory ... exists and is not empty. Previous log files in this
  directory will be deleted", which it says whenever another logger of the run wrote into the run's one folder
  first (runs.one_folder_per_run); it deletes only its own metrics.csv, whose rows a resume keeps.

The model summary leaves out its FLOPs column when it has no FLOPs to show: Lightning counts them only for a
model with an ``example_input_array``, and prints a column of zeros otherwise. The progress bar leaves out
``v_num``, the logger's version number (the run folder's ``version_N``, printed once when the run starts).
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import lightning_utilities.core.rank_zero as rank_zero_module
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count
from rich.file_proxy import FileProxy

DROPPED_LOG_LINES = {
    # logger name: the start of each message dropped from it
    "lightning.pytorch.utilities.rank_zero": ("💡 Tip: For seamless cloud logging",),
    "lightning.fabric.utilities.rank_zero": ("💡 Tip: For seamless cloud logging",),
}
# The loggers Lightning gives a handler of its own (its packages' __init__), printing to the streams of the import.
LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric")
DROPPED_WARNINGS = [
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"Experiment logs directory .* exists and is not empty\. Previous log files in this directory will be deleted",
     UserWarning),
]


class DropMessages(logging.Filter):
    """A logging filter that drops the records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


def quiet_console() -> None:
    """Install the filters above (once per process; calling it again changes nothing)."""
    loggers = {name: logging.getLogger(name) for name in DROPPED_LOG_LINES}
    loggers[rank_zero_module.log.name] = rank_zero_module.log  # whichever of the two rank_zero loggers is in use
    for name, logger in loggers.items():
        starts = DROPPED_LOG_LINES.get(name, DROPPED_LOG_LINES["lightning.pytorch.utilities.rank_zero"])
        if not any(isinstance(f, DropMessages) and f.starts == starts for f in logger.filters):
            logger.addFilter(DropMessages(starts))
    for message, category in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


class Summary(RichModelSummary):
    """Lightning's rich model summary, without the FLOPs column and total when there are no FLOPs to show."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if total_flops:
            return RichModelSummary.summarize(
                summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                total_flops, **summarize_kwargs,
            )  # fmt: skip
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            justify = "right" if name in ("Params", "Params per Device", "In sizes", "Out sizes") else "left"
            table.add_column(name, justify=justify, style="dim" if name == " " else None)
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        grid = Table.grid(expand=True)
        grid.add_column()
        for label, value in (
            ("Trainable params", get_human_readable_count(int(trainable_parameters))),
            ("Non-trainable params", get_human_readable_count(int(total_parameters - trainable_parameters))),
            ("Total params", get_human_readable_count(int(total_parameters))),
            ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
            ("Modules in train mode", total_training_modes["train"]),
            ("Modules in eval mode", total_training_modes["eval"]),
        ):
            grid.add_row(f"[bold]{label}[/]: {value}")
        console.print(grid)


def use_quiet_summary(trainer: Trainer) -> None:
    """Turn Lightning's model summary (its default, or one in the config) into ``Summary``.

    As for the progress bar, only the class changes, to a subclass that adds nothing but ``summarize``: the
    summary keeps its depth and settings. Like ``RichModelSummary``, it needs rich (installed with Lightning).
    """
    for callback in trainer.callbacks:
        if type(callback) in (ModelSummary, RichModelSummary):
            callback.__class__ = Summary


class QuietRichProgressBar(RichProgressBar):
    """Lightning's rich progress bar without ``v_num`` (Lightning's documented way: override ``get_metrics``), and
    with Lightning's log lines of a ``fit`` printed above the bar, as a ``print()`` is.

    While the bar is live, rich puts a proxy in place of ``sys.stderr`` and ``sys.stdout`` that prints each line above
    it. Lightning's log handlers keep the streams they were given at import, so their lines ("`Trainer.fit` stopped:
    `max_epochs=10` reached." at the end of every run) went under the bar, glued to its last line. From the start of
    training to the end of ``fit`` they write to the proxies instead."""

    def get_metrics(self, trainer: Trainer, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)  # the bar is live from here: the proxies are in place
        self._put_back_streams()
        proxies = {proxy.rich_proxied_file: proxy for proxy in (sys.stderr, sys.stdout) if isinstance(proxy, FileProxy)}
        swapped = []  # (handler, the stream it had)
        for name in LIGHTNING_LOGGERS:
            for handler in logging.getLogger(name).handlers:
                if type(handler) is logging.StreamHandler and handler.stream in proxies:
                    swapped.append((handler, handler.setStream(proxies[handler.stream])))
        self._handler_streams = swapped  # (the bar may be one made by Lightning, given this class: no __init__ of ours)

    def _put_back_streams(self) -> None:
        for handler, stream in getattr(self, "_handler_streams", []):
            handler.setStream(stream)
        self._handler_streams = []

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        self._put_back_streams()
        super().teardown(trainer, pl_module, stage)

    def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
        self._put_back_streams()
        super().on_exception(trainer, pl_module, exception)


class QuietTQDMProgressBar(TQDMProgressBar):
    """Lightning's tqdm progress bar (used where rich is not installed) without ``v_num``."""

    def get_metrics(self, trainer: Trainer, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


QUIET_BARS = {RichProgressBar: QuietRichProgressBar, TQDMProgressBar: QuietTQDMProgressBar}


def use_quiet_progress_bar(trainer: Trainer) -> None:
    """Turn Lightning's progress bar (its default, or one in the config) into the quiet one of the same kind.

    The bar keeps its settings (refresh rate, theme, ...): only its class changes, to a subclass that adds
    nothing but ``get_metrics``. With ``--trainer.enable_progress_bar false`` there is no bar and nothing to do.
    """
    for callback in trainer.callbacks:
        if type(callback) in QUIET_BARS:
            callback.__class__ = QUIET_BARS[type(callback)]
