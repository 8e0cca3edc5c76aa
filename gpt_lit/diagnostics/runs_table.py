"""The runs table: each ``fit``'s defining settings and final losses in TensorBoard's HParams tab.

The row is TensorBoard's ``hparams_pb``; the experiment (which columns differ) and the session's end (failed or not)
are built here: ``SummaryWriter.add_hparams`` writes all three at once into a run of its own, and neither it nor
TensorBoard's builders mark differing columns or end a session without TensorFlow."""

import os
import time
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.hparams.summary_v2 import hparams_pb
from torch.utils.tensorboard import SummaryWriter

from gpt_lit.diagnostics.probe import ValidationStep, log_at, tensorboards

# The HParams tab's metric columns: TensorBoard shows each one's last scalar value in the session's run.
METRICS = {"loss/train": "final training loss (whole set)", "loss/val": "final validation loss",
           "loss/val_best": "best validation loss"}  # fmt: skip


def run_settings(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, bool | float | str]:
    """The settings that define a run of the chapter: the model's shape, the optimizer, the data, the seeds."""
    cfg, dm = pl_module.model.cfg, trainer.datamodule
    seed = os.environ.get("PL_GLOBAL_SEED")  # set by seed_everything (LightningCLI's too)
    settings = {k: getattr(cfg, k) for k in ("n_layers", "residual", "emb_dim", "n_heads", "dropout")}
    settings |= {
        "lr": pl_module.hparams.get("lr"),
        "batch_size": getattr(dm, "batch_size", None),
        "context_length": getattr(dm, "context_length", cfg.context_length),
        "precision": str(trainer.precision),
        "seed_everything": None if seed is None else int(seed),
        "data.seed": getattr(dm, "seed", None),
    }
    return {k: v for k, v in settings.items() if v is not None}


def hparams_summary(tag: str, **data: Any) -> Summary:
    """A summary of HParams plugin data (``plugin_data_pb2.HParamsPluginData(**data)``), as TensorBoard reads it."""
    content = metadata.create_summary_metadata(plugin_data_pb2.HParamsPluginData(**data))
    return Summary(value=[Summary.Value(tag=tag, metadata=content)])


def experiment_summary(settings: dict[str, bool | float | str], first: list[str] = ()) -> Summary:
    """Which settings are the table's columns (and their types), marked as differing between runs if in ``first``
    (TensorBoard lists those first and shows the first five), and which scalar tags are its metrics."""
    types = {bool: api_pb2.DATA_TYPE_BOOL, str: api_pb2.DATA_TYPE_STRING}
    experiment = api_pb2.Experiment(
        hparam_infos=[
            api_pb2.HParamInfo(name=k, type=types.get(type(v), api_pb2.DATA_TYPE_FLOAT64), differs=k in first)
            for k, v in settings.items()
        ],
        metric_infos=[
            api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), display_name=tag, description=text)
            for tag, text in METRICS.items()
        ],
    )
    return hparams_summary(metadata.EXPERIMENT_TAG, experiment=experiment)


def session_end_summary(status: int) -> Summary:
    end = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=time.time())
    return hparams_summary(metadata.SESSION_END_INFO_TAG, session_end_info=end)


def add_summaries(trainer: L.Trainer, *summaries: Summary) -> None:
    """``summaries`` into every TensorBoard writer's event file, flushed (SummaryWriter has no call that adds one);
    a writer Lightning closed after an earlier run of the Trainer (``validate``, then ``fit``) into a new file."""
    for writer in tensorboards(trainer):
        closed = writer.file_writer is None
        into = SummaryWriter(writer.get_logdir()) if closed else writer
        for summary in summaries:
            into.file_writer.add_summary(summary)
        into.close() if closed else into.flush()


class RunsTable(ValidationStep):
    def __init__(self, first: list[str] | None = None) -> None:
        """HParams: one row per ``fit``, its settings (``run_settings``) and the last ``loss/train``, ``loss/val`` and
        ``loss/val_best`` (the lowest ``loss/val`` so far, logged after every validation); the chapter's loss table
        of every run. Other loggers (CSV) get the settings through ``log_hyperparams`` (which for TensorBoard would
        also write placeholder values into the metrics' tags).

        Args:
            first: The settings shown first (TensorBoard shows five columns until more are ticked); default
                n_layers, residual, lr, precision, seed_everything: what the chapter's runs vary.
        """
        self.first = list(first or ["n_layers", "residual", "lr", "precision", "seed_everything"])
        self.best: float | None = None
        self.started = False  # a session started in TensorBoard by this process (only fit starts one)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.loggers or not trainer.is_global_zero:
            return
        settings = run_settings(trainer, pl_module)
        self.started = True
        add_summaries(trainer, experiment_summary(settings, self.first), hparams_pb(settings, trial_id=""))
        for logger in trainer.loggers:
            if not isinstance(logger, TensorBoardLogger):
                logger.log_hyperparams(settings)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the module's on_validation_epoch_end, whose loss/val is this validation's: logged at its step.
        val = (getattr(pl_module, "last_validation", None) or {}).get("loss/val")
        if self.fitting(trainer) and val is not None:
            self.best = val if self.best is None else min(self.best, val)
            log_at(trainer, {"loss/val_best": self.best}, self.step)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        add_summaries(trainer, session_end_summary(api_pb2.STATUS_SUCCESS))

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # A stopped run resumes: no end yet. A command that failed before fit started a session writes nothing.
        if self.started and not isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            add_summaries(trainer, session_end_summary(api_pb2.STATUS_FAILURE))

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict.get("best")
