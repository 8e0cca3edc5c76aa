"""Position similarity: do the positions of a sequence still differ after each block of the stack?"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback

from gpt_lit.callbacks.tensorboard_log import epoch_end_step, is_fresh_start, shards_parameters
from gpt_lit.model import GPT


def mean_position_similarity(hidden: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity over all pairs of different positions i != j, per sequence, then averaged.

    hidden: (B, T, C) vectors of each position. Returns a scalar; 1 means every position is the same vector.
    """
    B, T, _ = hidden.shape
    unit = F.normalize(hidden.float(), dim=-1)  # (B, T, C)
    sims = unit @ unit.transpose(1, 2)  # (B, T, T)
    off_diagonal = sims.sum(dim=(1, 2)) - sims.diagonal(dim1=1, dim2=2).sum(dim=1)  # (B,)
    return (off_diagonal / (T * (T - 1))).mean()


def block_outputs(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """The stream after each block, 1 .. n_layers, (B, T, emb_dim) each, for the token IDs ``idx`` (B, T).

    One pass of ``model.hidden_states`` with a forward hook on every block, in whatever mode the model is in.
    """
    outputs: list[torch.Tensor] = []
    hooks = [blk.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for blk in model.blocks]
    try:
        model.hidden_states(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return outputs


@torch.no_grad()
def block_similarities(model: GPT, idx: torch.Tensor) -> list[float]:
    """``mean_position_similarity`` of the output of each block, 1 .. n_layers, for the token IDs ``idx`` (B, T).

    The last value is the similarity at the top of the stack, before the final norm.
    """
    return [mean_position_similarity(out).item() for out in block_outputs(model, idx)]


class PositionSimilarity(Callback):
    def __init__(self, num_sequences: int = 8):
        """Log the similarity between positions after every block, at the start of training and after every epoch.

        The mean cosine similarity between the output vectors of different positions of a sequence, over the
        first ``num_sequences`` validation windows (a fixed batch), evaluated without dropout and without
        gradients: ``similarity/block_1`` ... ``similarity/block_N`` at the output of each block, and
        ``similarity/positions`` at the top of the stack (before the final norm; equal to block_N), the
        chapter's number: 0.563 with residuals, 1.000 without (12 blocks, untrained). Epoch-end values share
        the step of ``loss/val``. Skipped, with one logged line, under strategies that shard the parameters.

        Args:
            num_sequences: How many validation windows to average over (a fixed batch).
        """
        self.num_sequences = num_sequences
        self.batch: torch.Tensor | None = None
        self.history: list[dict[str, Any]] = []  # {"step", "epoch" (0: start), "blocks"}; in checkpoints
        self.active = True

    def measure(self, pl_module: L.LightningModule) -> list[float]:
        """The similarity after each block of ``pl_module.model`` for the fixed batch, in eval mode."""
        was_training = pl_module.training
        pl_module.eval()
        try:
            return block_similarities(pl_module.model, self.batch.to(pl_module.device))
        finally:
            pl_module.train(was_training)

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: int) -> None:
        if trainer.logger is None or trainer.sanity_checking or not trainer.is_global_zero:
            return
        blocks = self.measure(pl_module)
        self.history.append({"step": step, "epoch": epoch, "blocks": blocks})
        metrics = {f"similarity/block_{i}": v for i, v in enumerate(blocks, 1)}
        metrics["similarity/positions"] = blocks[-1]
        trainer.logger.log_metrics(metrics, step=step)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.active = not shards_parameters(trainer, "PositionSimilarity")
        val = trainer.datamodule.val_set
        n = min(self.num_sequences, len(val))
        self.batch = torch.stack([val[i][0] for i in range(n)])  # (n, T)
        if self.active and is_fresh_start(trainer):  # a resumed run logged its start already
            self._log(trainer, pl_module, step=0, epoch=0)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.active:
            self._log(trainer, pl_module, step=epoch_end_step(trainer), epoch=trainer.current_epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
