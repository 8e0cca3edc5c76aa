"""Per-block gradient norms: the chapter's measure of how much training signal reaches each block."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class BlockGradNorms(Callback):
    def __init__(self, param: str = "ffn.fc.weight"):
        """Log the L2 norm of each block's ``param`` gradient as ``grad_norm/block_1`` ... ``block_N``.

        Taken after backward and before the optimizer step: after AMP unscaling and before any gradient
        clipping (Lightning calls ``on_before_optimizer_step`` between the two). Only on logging steps
        (``trainer.log_every_n_steps``), so other steps pay nothing.

        Args:
            param: Which parameter of each block to measure; the chapter uses the first feed-forward weight.
        """
        self.param = param

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if not trainer._logger_connector.should_update_logs:
            return
        grads = [blk.get_parameter(self.param).grad for blk in pl_module.model.blocks]
        if any(g is None for g in grads):
            return
        # Gradients are already averaged across processes under DDP, so rank 0's norms are everyone's.
        norms = torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])  # (n_layers,)
        pl_module.log_dict({f"grad_norm/block_{i}": n for i, n in enumerate(norms, 1)}, rank_zero_only=True)
