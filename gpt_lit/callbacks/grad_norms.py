"""Per-block gradient norms: the chapter's measure of how much training signal reaches each block."""

from __future__ import annotations

import lightning as L
import torch

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.figures import ReusedFigure, add_figure, grad_norm_figure
from gpt_lit.callbacks.tensorboard_log import tensorboard_writers
from gpt_lit.distributed import shards_parameters


class BlockGradNorms(AfterValidation):
    def __init__(self, param: str = "ffn.fc.weight", figure: bool = True):
        """Log the L2 norm of each block's ``param`` gradient as ``grad_norm/block_1`` ... ``block_N``.

        Taken after backward and before the optimizer step: after AMP unscaling and before any gradient
        clipping (Lightning calls ``on_before_optimizer_step`` between the two; under 16-mixed
        ``GPTLightning`` uses the AdamW that lets Lightning unscale first). Logged with ``self.log`` at every
        optimizer step, so Lightning decides which steps reach the loggers and at which step, as for the step's
        loss: every ``trainer.log_every_n_steps``-th, the step at which the run stops, every step under
        ``fast_dev_run``; to every logger the trainer has. The norms stay tensors on the model's device until
        Lightning writes them, so the steps it does not log wait for nothing. Under DDP every process holds the
        averaged gradients, so each process's norms are everyone's (the loggers write process 0's); under a
        strategy that shards the parameters (FSDP) each process holds only a piece of each gradient, and the norms
        are not logged (said once). With ``figure``, after every validation of ``fit`` the image
        ``figures/grad_norm_by_block`` (to every TensorBoard logger, at the validation's step): the norms of the
        last optimizer step (``latest``) against the block's depth.

        Args:
            param: Which parameter of each block to measure; the chapter uses the first feed-forward weight.
            figure: Draw the figure too (else the scalars only).
        """
        self.param = param
        self.figure = figure
        self.reused = ReusedFigure()  # the figure, drawn again after each validation
        self.sharded = False
        self._latest: tuple[int, torch.Tensor] | None = None  # (step, the norms of blocks 1 .. N) of the last step

    @property
    def latest(self) -> tuple[int, list[float]] | None:
        """(the step, the norms of blocks 1 .. N) of the last optimizer step of this fit; None before one."""
        return None if self._latest is None else (self._latest[0], self._latest[1].tolist())

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sharded = shards_parameters(trainer, "BlockGradNorms")  # each process holds a shard of each gradient
        self._latest = None

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.sharded:
            return
        grads = [blk.get_parameter(self.param).grad for blk in pl_module.model.blocks]
        if any(g is None for g in grads):
            return
        norms = torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])  # blocks 1 .. N
        for i, norm in enumerate(norms, 1):
            pl_module.log(f"grad_norm/block_{i}", norm, on_step=True, on_epoch=False)
        self._latest = (trainer.global_step, norms)

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        writers = tensorboard_writers(trainer)
        latest = self.latest
        if self.figure and latest is not None and trainer.is_global_zero and writers:
            fig = grad_norm_figure(latest[1], latest[0], self.reused)  # the norms, their step
            add_figure(writers, "figures/grad_norm_by_block", fig, validation.step)
