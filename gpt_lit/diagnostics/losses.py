"""The losses as TensorBoard shows them: the chapter's loss figure, the unigram floor, the Custom Scalars charts and
the runs table (the chapter's loss table, one row per run) in the HParams tab."""

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

from gpt_lit.diagnostics.figures import draw_losses
from gpt_lit.diagnostics.probe import History, ValidationStep, log_at, show, tensorboards


class ChapterFigures(History):
    def __init__(self) -> None:
        """``figures/losses``: the module's ``last_validation`` losses so far and the unigram floor, as the chapter."""
        super().__init__()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the module's on_validation_epoch_end: its results are this validation's.
        if not self.fitting(trainer) or not trainer.is_global_zero:
            return
        results = getattr(pl_module, "last_validation", None) or {}
        self.history.append({"epoch": self.epoch, "step": self.step, "train": results.get("loss/train"),
                            "val": results.get("loss/val")})  # fmt: skip
        floor, residual = getattr(trainer.datamodule, "unigram_floor", None), pl_module.model.cfg.residual
        show(trainer, "figures/losses", self.step, self.chart,
             lambda ax: draw_losses(ax, self.history, floor, residual), legend=False)  # fmt: skip


def chart_layout() -> dict[str, dict[str, list]]:
    """The Custom Scalars tab: category -> chart -> ["Multiline", tag patterns (anchored: TensorBoard searches)]."""
    floor = "^loss/unigram_baseline$"
    return {
        "The chapter's figure": {
            "loss (whole sets, per epoch) and the unigram floor": ["Multiline", ["^loss/train$", "^loss/val$", floor]],
            "training loss per step (with dropout) and the unigram floor": ["Multiline", ["^loss/train_step$", floor]],
        },
        "Depth: one line per block": {
            "gradient norm of each block's ffn.fc.weight": ["Multiline", [r"^grad_norm/block_\d+$"]],
            "similarity between positions after each block": ["Multiline", [r"^similarity/block_\d+$"]],
        },
    }


class UnigramBaseline(ValidationStep):
    def __init__(self, chart: bool = True):
        """``loss/unigram_baseline``: the data module's ``unigram_floor`` at step 0 and beside each validation's losses
        (no more points than theirs: TensorBoard's outlier-ignoring scale stays on the losses).

        Args:
            chart: Add TensorBoard's Custom Scalars layout (``chart_layout``).
        """
        self.chart = chart

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for writer in tensorboards(trainer) if self.chart else []:
            writer.add_custom_scalars(chart_layout())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is None:  # the line starts at step 0 (a resumed run logged it before)
            log_at(trainer, {"loss/unigram_baseline": trainer.datamodule.unigram_floor}, 0)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.fitting(trainer):
            pl_module.log("loss/unigram_baseline", trainer.datamodule.unigram_floor, sync_dist=True)


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
    """The table's columns, those in ``first`` marked as differing (no builder of torch's or TensorBoard's can)."""
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
    """``summaries`` into every TensorBoard writer's event file, flushed (a new file where Lightning closed it)."""
    for writer in tensorboards(trainer):
        closed = writer.file_writer is None
        into = SummaryWriter(writer.get_logdir()) if closed else writer
        for summary in summaries:
            into.file_writer.add_summary(summary)
        into.close() if closed else into.flush()


class RunsTable(ValidationStep):
    def __init__(self, first: list[str] | None = None) -> None:
        """HParams: a row per ``fit``, its ``run_settings`` and last ``loss/train``, ``loss/val``, ``loss/val_best``
        (the lowest ``loss/val`` so far); other loggers (CSV) get the settings through ``log_hyperparams``.

        Args:
            first: The settings shown first (TensorBoard shows five columns); default: what the chapter's runs vary.
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
