"""What a run prints: Lightning's bar, summary and losses, without Lightning's litlogger tip and note of a summary
callback, PyTorch's ``LeafSpec`` FutureWarning, CSVLogger's "Previous log files ... will be deleted" (a resume keeps
the rows), LightningCLI's of ``main(args)`` beside ``sys.argv``, the summary's FLOPs and the bar's ``v_num``."""

import logging
import sys
import warnings
from typing import Any

import lightning_utilities.core.rank_zero as rank_zero_module
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ModelSummary, ProgressBar, RichModelSummary, RichProgressBar
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count
from rich import get_console
from rich.file_proxy import FileProxy
from rich.table import Table

DROPPED_LOG_LINES = ("💡 Tip: For seamless cloud logging", "Trainer already configured with model summary callbacks")
DROPPED_WARNINGS = [
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"Experiment logs directory .* exists and is not empty\. Previous log files in this directory will be deleted",
     UserWarning),
    (r"LightningCLI's args parameter is intended to run from within Python", UserWarning),
]


def shown(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(DROPPED_LOG_LINES)


def quiet_console() -> None:
    """Install the filters above (once per process)."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
    for logger in {*map(logging.getLogger, names), rank_zero_module.log}:
        logger.addFilter(shown)  # a filter already there is not added again
    for message, category in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


class Summary(RichModelSummary):
    """Lightning's rich model summary without its FLOPs (none counted without an ``example_input_array``)."""

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int, **kwargs: Any) -> None:
        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            table.add_column(name, justify="right" if name.startswith("Params") else "left",
                             style="dim" if name == " " else None)  # fmt: skip
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        get_console().print(table)
        count = get_human_readable_count
        get_console().print(f"[bold]Trainable params[/]: {count(int(trainable_parameters))}\n"
                            f"[bold]Non-trainable params[/]: {count(int(total_parameters - trainable_parameters))}\n"
                            f"[bold]Total params[/]: {count(int(total_parameters))}\n"
                            f"[bold]Total estimated model params size (MB)[/]: {get_formatted_model_size(model_size)}\n"
                            f"[bold]Modules in train mode[/]: {total_training_modes['train']}\n"
                            f"[bold]Modules in eval mode[/]: {total_training_modes['eval']}")


class QuietRichProgressBar(RichProgressBar):
    """Lightning's rich progress bar without ``v_num``, with Lightning's log lines of a ``fit`` printed above it (its
    handlers write, while the bar is live, to rich's proxies of their streams)."""

    def get_metrics(self, trainer: Trainer, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)  # the bar is live: the proxies are in place
        self._set_streams(live=True)

    @staticmethod
    def _set_streams(live: bool) -> None:
        """Lightning's log handlers on rich's proxies of their streams while the bar is ``live``, else on those."""
        proxies = {p.rich_proxied_file: p for p in (sys.stderr, sys.stdout) if live and isinstance(p, FileProxy)}
        for handler in (h for n in ("lightning.pytorch", "lightning.fabric") for h in logging.getLogger(n).handlers):
            if type(handler) is logging.StreamHandler:
                stream = getattr(handler.stream, "rich_proxied_file", handler.stream)  # a proxy's: its stream
                handler.setStream(proxies.get(stream, stream))

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        self._set_streams(live=False)
        super().teardown(trainer, pl_module, stage)

    def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
        self._set_streams(live=False)
        super().on_exception(trainer, pl_module, exception)


def quiet_callbacks(trainer: Any, callbacks: list[Callback]) -> list[Callback]:
    """The quiet bar and summary, each unless the callbacks have one or the settings (``trainer``) turn it off."""
    quiet: list[Callback] = []
    if trainer.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
        quiet.append(QuietRichProgressBar())
    if trainer.get("enable_model_summary") is not False and not any(isinstance(c, ModelSummary) for c in callbacks):
        quiet.append(Summary())
    return quiet
