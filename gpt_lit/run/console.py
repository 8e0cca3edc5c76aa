"""What a run prints: Lightning's progress bar, model summary and losses, without the dependencies' noise.

Four messages are dropped, each matched exactly (every other warning and log line still shows):

- Lightning's "💡 Tip: For seamless cloud logging ... try installing litlogger" advertisement, at every start;
- Lightning's "Trainer already configured with model summary callbacks", as the Trainer is given the summary below;
- PyTorch's "`isinstance(treespec, LeafSpec)` is deprecated" FutureWarning, which Lightning's own
  ``_pytree`` helper triggers once in every process;
- Lightning's CSVLogger's "Experiment logs directory ... exists and is not empty. Previous log files in this
  directory will be deleted", which it says whenever another logger of the run wrote into the run's one folder
  first (folders.one_folder_per_run); it deletes only its own metrics.csv, whose rows a resume keeps.

The model summary leaves out its FLOPs column when it has no FLOPs to show: Lightning counts them only for a
model with an ``example_input_array``, and prints a column of zeros otherwise. The progress bar leaves out
``v_num``, the logger's version number (the run folder's ``version_N``, printed once when the run starts). Both are
given to the Trainer as its callbacks (``quiet_callbacks``), in place of Lightning's defaults; a bar or summary the
config lists is used as given (``gpt_lit.run.console.QuietRichProgressBar`` there takes RichProgressBar's arguments).
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import lightning_utilities.core.rank_zero as rank_zero_module
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ModelSummary, ProgressBar, RichModelSummary, RichProgressBar
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count
from rich.file_proxy import FileProxy

# The start of each message dropped from Lightning's two rank-zero loggers
DROPPED_LOG_LINES = ("💡 Tip: For seamless cloud logging", "Trainer already configured with model summary callbacks")
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
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
    # rank_zero_module.log: whichever of the two rank_zero loggers is in use
    for logger in {*map(logging.getLogger, RANK_ZERO_LOGGERS), rank_zero_module.log}:
        if not any(isinstance(f, DropMessages) for f in logger.filters):
            logger.addFilter(DropMessages(DROPPED_LOG_LINES))
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


class QuietRichProgressBar(RichProgressBar):
    """Lightning's rich progress bar without ``v_num`` (Lightning's documented way: override ``get_metrics``), and
    with Lightning's log lines of a ``fit`` printed above the bar, as a ``print()`` is.

    While the bar is live, rich puts a proxy in place of ``sys.stderr`` and ``sys.stdout`` that prints each line above
    it. Lightning's log handlers keep the streams they were given at import, so their lines ("`Trainer.fit` stopped:
    `max_epochs=10` reached." at the end of every run) went under the bar, glued to its last line. From the start of
    training to the end of ``fit`` they write to the proxies instead."""

    _handler_streams: tuple[tuple[logging.StreamHandler, Any], ...] = ()  # (handler, the stream it had): while live

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
        self._handler_streams = tuple(swapped)

    def _put_back_streams(self) -> None:
        for handler, stream in self._handler_streams:
            handler.setStream(stream)
        self._handler_streams = ()

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        self._put_back_streams()
        super().teardown(trainer, pl_module, stage)

    def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
        self._put_back_streams()
        super().on_exception(trainer, pl_module, exception)


def quiet_callbacks(trainer: Any, callbacks: list[Callback]) -> list[Callback]:
    """The quiet bar and summary for a Trainer of these settings (the config's ``trainer``) and callbacks: each
    unless the callbacks have one of their own or the settings turn it off (Lightning then makes no default either).
    """
    quiet: list[Callback] = []
    if trainer.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
        quiet.append(QuietRichProgressBar())
    if trainer.get("enable_model_summary") is not False and not any(isinstance(c, ModelSummary) for c in callbacks):
        quiet.append(Summary())
    return quiet
