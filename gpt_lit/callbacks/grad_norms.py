"""Per-block gradient norms: the chapter's measure of how much training signal reaches each block."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from gpt_lit.distributed import shards_parameters


def is_logging_step(trainer: L.Trainer) -> bool:
    """Whether the metrics of the optimizer step about to be taken are logged: Lightning's rule for ``self.log``
    (every ``log_every_n_steps``-th step, counted from 1, and the step at which the run stops)."""
    n = trainer.log_every_n_steps
    return n > 0 and ((trainer.global_step + 1) % n == 0 or trainer.should_stop)


class BlockGradNorms(Callback):
    def __init__(self, param: str = "ffn.fc.weight"):
        """Log the L2 norm of each block's ``param`` gradient as ``grad_norm/block_1`` ... ``block_N``.

        Taken after backward and before the optimizer step: after AMP unscaling and before any gradient
        clipping (Lightning calls ``on_before_optimizer_step`` between the two; under 16-mixed
        ``GPTLightning`` uses the AdamW that lets Lightning unscale first). Only on logging steps
        (``trainer.log_every_n_steps``), so other steps pay nothing, at the step ``self.log`` gives the
        step's loss (``trainer.global_step``, the optimizer steps before this one); written to the loggers
        directly, on the main process only (``self.log``'s bookkeeping for four values a step costs more;
        docs/performance.md). Under DDP every process holds the averaged gradients, so process 0's norms are
        everyone's; under a strategy that shards the parameters (FSDP) each process holds only a piece of
        each gradient, and the norms are not logged (said once). ``latest`` keeps the last step's norms for
        ``ChapterFigures``.

        Args:
            param: Which parameter of each block to measure; the chapter uses the first feed-forward weight.
        """
        self.param = param
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
