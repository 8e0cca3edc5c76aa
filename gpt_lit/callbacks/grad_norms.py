"""Per-block gradient norms: the chapter's measure of how much training signal reaches each block."""

from __future__ import annotations

import lightning as L
import torch

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.figures import ReusedFigure, add_figure, grad_norm_figure
from gpt_lit.callbacks.tensorboard_log import shards_parameters, tensorboard_writers


def is_logging_step(trainer: L.Trainer) -> bool:
    """Whether the metrics of the optimizer step about to be taken are logged: Lightning's rule for ``self.log``
    (every ``log_every_n_steps``-th step, counted from 1, and the step at which the run stops)."""
    n = trainer.log_every_n_steps
    return n > 0 and ((trainer.global_step + 1) % n == 0 or trainer.should_stop)


class BlockGradNorms(AfterValidation):
    def __init__(self, param: str = "ffn.fc.weight", figure: bool = True):
        """Log the L2 norm of each block's ``param`` gradient as ``grad_norm/block_1`` ... ``block_N``.

        Taken after backward and before the optimizer step: after AMP unscaling and before any gradient
        clipping (Lightning calls ``on_before_optimizer_step`` between the two; under 16-mixed
        ``GPTLightning`` uses the AdamW that lets Lightning unscale first). Only on logging steps
        (``trainer.log_every_n_steps``), so other steps pay nothing, at the step ``self.log`` gives the
        step's loss (``trainer.global_step``, the optimizer steps before this one); written to the loggers
        directly, on the main process only: ``self.log`` took ~3 ms a step for its four values, 0.2% of a
        10-epoch run. Under DDP every process holds the averaged gradients, so process 0's norms are
        everyone's; under a strategy that shards the parameters (FSDP) each process holds only a piece of
        each gradient, and the norms are not logged (said once). With ``figure``, after every validation of
        ``fit`` the image ``figures/grad_norm_by_block`` (to every TensorBoard logger, at the validation's step):
        the latest logged norms (``latest``) against the block's depth.

        Args:
            param: Which parameter of each block to measure; the chapter uses the first feed-forward weight.
            figure: Draw the figure too (else the scalars only).
        """
        self.param = param
        self.figure = figure
        self.reused = ReusedFigure()  # the figure, drawn again after each validation
        self.sharded = False
        self.latest: tuple[int, list[float]] | None = None  # (step, the norms of blocks 1 .. N) last logged

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sharded = shards_parameters(trainer, "BlockGradNorms")  # each process holds a shard of each gradient
        self.latest = None

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.sharded or not trainer.is_global_zero or not is_logging_step(trainer):
            return
        grads = [blk.get_parameter(self.param).grad for blk in pl_module.model.blocks]
        if any(g is None for g in grads):
            return
        norms = torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]).tolist()  # blocks 1 .. N
        step, metrics = trainer.global_step, {f"grad_norm/block_{i}": n for i, n in enumerate(norms, 1)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        self.latest = (step, norms)

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        writers = tensorboard_writers(trainer)
        if self.figure and self.latest is not None and trainer.is_global_zero and writers:
            fig = grad_norm_figure(self.latest[1], self.latest[0], self.reused)  # the norms, their step
            add_figure(writers, "figures/grad_norm_by_block", fig, validation.step)
