"""Per-block gradient norms: the chapter's measure of how much training signal reaches each block."""

from __future__ import annotations

import lightning as L
import torch

from gpt_lit.diagnostics.figures import Chart, draw_grad_norms
from gpt_lit.diagnostics.probe import ValidationStep, show
from gpt_lit.distributed import shards_parameters


class BlockGradNorms(ValidationStep):
    def __init__(self, param: str = "ffn.fc.weight", figure: bool = True):
        """Log the L2 norm of each block's ``param`` gradient as ``grad_norm/block_1`` ... ``block_N``.

        Taken after backward and before the optimizer step: after AMP unscaling and before any gradient clipping
        (Lightning's ``on_before_optimizer_step``). Logged with ``self.log`` at every optimizer step, so Lightning
        decides which steps reach the loggers, as for the step's loss: every ``trainer.log_every_n_steps``-th, the
        step at which the run stops; to every logger. The norms stay tensors on the model's device until Lightning
        writes them. Under DDP every process holds the averaged gradients; under a strategy that shards the
        parameters (FSDP) the norms are not logged (said once). With ``figure``, after every validation of ``fit``
        the image ``figures/grad_norm_by_block`` (at the validation's step): the norms of the last optimizer step
        (``latest``) against the block's depth.

        Args:
            param: Which parameter of each block to measure; the chapter uses the first feed-forward weight.
            figure: Draw the figure too (else the scalars only).
        """
        self.param = param
        self.figure = figure
        self.chart = Chart()
        self.sharded = False
        self.norms: tuple[int, torch.Tensor] | None = None  # (step, the norms of blocks 1 .. N) of the last step

    @property
    def latest(self) -> tuple[int, list[float]] | None:
        """(the step, the norms of blocks 1 .. N) of the last optimizer step of this fit; None before one."""
        return None if self.norms is None else (self.norms[0], self.norms[1].tolist())

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sharded = shards_parameters(trainer, "BlockGradNorms")  # each process holds a shard of each gradient
        self.norms = None

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.sharded:
            return
        grads = [blk.get_parameter(self.param).grad for blk in pl_module.model.blocks]
        if any(g is None for g in grads):
            return
        norms = torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])  # blocks 1 .. N
        for i, norm in enumerate(norms, 1):
            pl_module.log(f"grad_norm/block_{i}", norm, on_step=True, on_epoch=False)
        self.norms = (trainer.global_step, norms)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        latest = self.latest
        if self.figure and latest is not None and self.fitting(trainer):
            show(trainer, "figures/grad_norm_by_block", self.step, self.chart,
                 lambda ax: draw_grad_norms(ax, latest[1], latest[0]), legend=False)  # fmt: skip
