"""Tokens per second and MFU while a run trains and evaluates, through Lightning's ``ThroughputMonitor``."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor

from gpt_lit.flops import eval_flops_per_token, measured_peak, train_flops_per_token


def windows(batch: Any) -> int:
    """Windows (sequences) in a batch of (inputs, targets), or of (prompt numbers, prompts) in predict."""
    return batch[1].shape[0]


def tokens(batch: Any) -> int:
    return batch[1].numel()


def matmul_dtype(precision: str) -> torch.dtype:
    """The dtype the matmuls run in under a trainer precision ("32-true", "bf16-mixed", "16-mixed", "64-true", ...)."""
    return {"bf": torch.bfloat16, "16": torch.float16, "64": torch.float64}.get(precision[:2], torch.float32)


class Throughput(ThroughputMonitor):
    def __init__(self, window_size: int = 5):
        """Lightning's ``ThroughputMonitor`` with gpt_lit/flops.py's FLOPs of the matmuls and MFU over this machine's
        measured peak (``flops.measured_peak``).

        Args:
            window_size: Steps (or evaluation batches) each rate is averaged over; at least 2.
        """
        super().__init__(batch_size_fn=windows, length_fn=tokens, window_size=window_size)
        self.peak: float | None = None  # FLOP/s of the measured matmul

    @property
    def available_flops(self) -> int | None:
        """The peak MFU is taken against: the measured one, once ``setup`` measured it."""
        return self.listed_flops if self.peak is None else int(self.peak)

    @available_flops.setter
    def available_flops(self, flops: int | None) -> None:
        # ThroughputMonitor.setup sets it from Lightning's table of devices (none for CPUs) and hands it on: kept aside.
        self.listed_flops = flops

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.peak is None and stage != "predict":  # generation counts no FLOPs: no MFU, no peak to measure
            device, dtype = trainer.strategy.root_device, matmul_dtype(str(trainer.precision))
            self.peak = measured_peak(device, dtype, torch.get_num_threads())
        super().setup(trainer, pl_module, stage)

    def count(self, pl_module: L.LightningModule, batch: Any, training: bool) -> None:
        """Set ``flops_per_batch``, which ThroughputMonitor reads from the module after the batch."""
        per_token = train_flops_per_token if training else eval_flops_per_token
        pl_module.flops_per_batch = per_token(pl_module.model.cfg, batch[1].shape[1]) * tokens(batch)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        self.count(pl_module, batch, training=True)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.count(pl_module, batch, training=False)

    on_test_batch_start = on_validation_batch_start

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        pl_module.flops_per_batch = None  # generation: no FLOP count, tokens/s only
