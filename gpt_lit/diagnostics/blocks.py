"""Block by block, a scalar per block and a figure against depth: the gradient norms and, on fixed validation
windows, the similarity between positions, the residual stream's size and each sub-layer's write, the logit lens."""

import lightning as L
import torch

from gpt_lit import measure
from gpt_lit.diagnostics.figures import Chart, draw_by_block, draw_grad_norms, draw_stream
from gpt_lit.diagnostics.probe import Probe, ValidationStep, show
from gpt_lit.distributed import shards_parameters


class BlockGradNorms(ValidationStep):
    def __init__(self, param: str = "ffn.fc.weight", figure: bool = True):
        """``grad_norm/block_N``: each block's ``param`` gradient's L2 norm, unscaled, before clipping, at every step
        (Lightning writes every ``log_every_n_steps``-th); with ``figure``, the last: ``figures/grad_norm_by_block``.

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
        grads = [] if self.sharded else [blk.get_parameter(self.param).grad for blk in pl_module.model.blocks]
        if not grads or any(g is None for g in grads):
            return
        norms = torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])  # blocks 1 .. N
        for i, norm in enumerate(norms, 1):
            pl_module.log(f"grad_norm/block_{i}", norm, on_step=True, on_epoch=False)
        self.norms = (trainer.global_step, norms)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.figure and (latest := self.latest) is not None and self.fitting(trainer):
            show(trainer, "figures/grad_norm_by_block", self.step, self.chart,
                 lambda ax: draw_grad_norms(ax, latest[1], latest[0]), legend=False)  # fmt: skip


class PositionSimilarity(Probe):
    def __init__(self, num_sequences: int = 4, figure: bool = True):
        """``similarity/block_N``: ``measure.position_similarity`` after block N; ``similarity/positions``: the last
        block's (the chapter's 0.563 with residuals, 1.000 without); with ``figure``, ``figures/similarity_by_block``.

        Args:
            num_sequences: How many validation windows to average over (a fixed batch).
            figure: Draw the figure too (else the scalars only).
        """
        super().__init__(num_sequences)
        self.figure = figure

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        blocks = [measure.position_similarity(out).mean().item() for out in self.record(pl_module).block_out]
        self.history.append({"step": step, "epoch": epoch, "blocks": blocks})  # epoch 0: the start
        if self.figure and epoch > 0:  # after a validation (the start is drawn with the first)
            show(trainer, "figures/similarity_by_block", step, self.chart,
                 lambda ax: draw_by_block(ax, self.history, trainer.max_epochs, "similarity", None))  # fmt: skip
        return {**{f"similarity/block_{i}": v for i, v in enumerate(blocks, 1)}, "similarity/positions": blocks[-1]}


class ResidualStream(Probe):
    """``stream/rms/*``: the stream's RMS; ``stream/update/*``: ``measure.update_ratios``; their figure by block."""

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        record = self.record(pl_module)
        attn, ffn = (ratios.tolist() for ratios in measure.update_ratios(record))
        embeddings, rms = measure.token_rms(record.attn_in[0]), measure.stream_sizes(record)  # (B, T), (n_layers, B, T)
        point = {"step": step, "epoch": epoch, "embeddings": measure.batch_rms(embeddings).item(),
                 "rms": measure.batch_rms(rms).tolist(), "attn": attn, "ffn": ffn}  # fmt: skip
        self.history.append(point)
        show(trainer, "figures/stream_by_block", step, self.chart,
             lambda ax: draw_stream(ax, self.history, pl_module.model.cfg.residual, trainer.max_epochs))  # fmt: skip
        metrics = {"stream/rms/embeddings": point["embeddings"]}
        for i, (rms, a, f) in enumerate(zip(point["rms"], attn, ffn, strict=True), 1):
            metrics |= {f"stream/rms/block_{i}": rms, f"stream/update/attn_{i}": a, f"stream/update/ffn_{i}": f}
        return metrics


class LogitLens(Probe):
    at_start = False  # the head reads nothing useful before training

    def __init__(self, num_sequences: int = 2):
        """``lens/block_N``: the loss of the stream after block N read out by the head, and ``figures/lens_by_block``.

        Args:
            num_sequences: How many validation windows to measure on (a fixed batch).
        """
        super().__init__(num_sequences)

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        losses = measure.lens_losses(pl_module.model, self.record(pl_module), self.targets.to(pl_module.device))
        blocks = losses.flatten(1).mean(dim=1).tolist()
        self.history.append({"step": step, "epoch": epoch, "blocks": blocks})
        floor = getattr(trainer.datamodule, "unigram_floor", None)
        show(trainer, "figures/lens_by_block", step, self.chart,
             lambda ax: draw_by_block(ax, self.history, trainer.max_epochs, "lens", floor))  # fmt: skip
        return {f"lens/block_{i}": v for i, v in enumerate(blocks, 1)}
