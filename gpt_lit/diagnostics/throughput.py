"""Tokens per second and MFU while a run trains and evaluates, through Lightning's ``ThroughputMonitor``."""

from __future__ import annotations

import functools
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor

from gpt_lit.flops import eval_flops_per_token, matmul_peak, train_flops_per_token
from gpt_lit.model import count_params


def windows(batch: Any) -> int:
    """Windows (sequences) in a batch of (inputs, targets), or of (prompt numbers, prompts) in predict."""
    return batch[1].shape[0]


def tokens(batch: Any) -> int:
    return batch[1].numel()


def matmul_dtype(precision: str) -> torch.dtype:
    """The dtype the matmuls run in under a trainer precision ("32-true", "bf16-mixed", ...)."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float64 if precision.startswith("64") else torch.float32


SLOW = 5e9  # FLOP/s: a dtype without a fast kernel on the device (bf16 on a CPU without bf16 units) runs below it


@functools.cache
def measured_peak(device: torch.device, dtype: torch.dtype, threads: int) -> float:
    """FLOP/s of a 2048 x 2048 ``torch.mm`` on ``device`` in ``dtype`` with torch's ``threads``, the median of 3;
    that of one 512 x 512 ``torch.mm`` where it runs below ``SLOW`` (there a 2048 x 2048 one would take minutes).
    Measured once per process for each (the machine's rate is the same for the next run in a notebook or a test
    session, and each measurement takes time)."""
    small = matmul_peak(device, dtype, n=512, reps=1)
    return small if small < SLOW else matmul_peak(device, dtype, reps=3)


class Throughput(ThroughputMonitor):
    def __init__(self, window_size: int = 5, every_parameter: bool = False):
        """Log tokens per second and MFU of training and of evaluation: Lightning's ``ThroughputMonitor``, with
        the FLOPs counted as ``scripts/bench.py`` counts them and the peak measured on this machine.

        Tags (TensorBoard, Scalars): ``train/device/items_per_sec`` (tokens/s), ``train/device/mfu``,
        ``train/device/flops_per_sec``, ``train/device/samples_per_sec`` (windows/s), ``train/time`` (seconds
        of training so far, without the evaluations); the same under ``validate/`` for the evaluations, at each
        evaluation batch (its step axis counts evaluation batches). A rate is the mean over the last
        ``window_size`` steps, so it appears from the ``window_size``-th step of a run (of each evaluation).
        Time spent between steps (the epoch's end hooks, checkpoints) counts in the training rate.

        MFU = FLOPs per token x tokens/s / peak: training 6 N + 12 n_layers T emb_dim per token, evaluation
        2 N + 4 n_layers T emb_dim (gpt_lit/flops.py), over the rate of a 2048 x 2048 ``torch.mm`` in the
        precision's matmul dtype (the median of 3, as ``scripts/bench.py`` measures it; a 512 x 512 one where the
        dtype has no fast kernel), measured when the first run of the process starts (``measured_peak``).

        Args:
            window_size: Steps (or evaluation batches) each rate is averaged over; at least 2.
            every_parameter: Count N as every parameter (bench.py's ``mfu``; the token-embedding lookup counts as
                matmuls, so MFU can pass 1) instead of the weights that do matmuls (``mfu_matmul_only``).
        """
        super().__init__(batch_size_fn=windows, length_fn=tokens, window_size=window_size)
        self.every_parameter = every_parameter
        self.peak: float | None = None  # FLOP/s of the measured matmul

    @property
    def available_flops(self) -> int | None:
        """The peak MFU is taken against: the measured one, once ``setup`` measured it."""
        return self.listed_flops if self.peak is None else int(self.peak)

    @available_flops.setter
    def available_flops(self, flops: int | None) -> None:
        # ThroughputMonitor sets its public ``available_flops`` from Lightning's table of devices (none for CPUs) in
        # ``setup`` and gives it to the counters it makes there: kept as ``listed_flops``, the measured peak is given.
        self.listed_flops = flops

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.peak is None:
            device, dtype = trainer.strategy.root_device, matmul_dtype(str(trainer.precision))
            self.peak = measured_peak(device, dtype, torch.get_num_threads())
        super().setup(trainer, pl_module, stage)

    def count(self, pl_module: L.LightningModule, batch: Any, training: bool) -> None:
        """Set ``flops_per_batch``, which ThroughputMonitor reads from the module after the batch."""
        model = pl_module.model
        n = count_params(model) if self.every_parameter else None
        per_token = train_flops_per_token if training else eval_flops_per_token
        pl_module.flops_per_batch = per_token(model.cfg, batch[1].shape[1], n) * tokens(batch)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        self.count(pl_module, batch, training=True)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.count(pl_module, batch, training=False)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.count(pl_module, batch, training=False)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        pl_module.flops_per_batch = None  # generation: no FLOP count, tokens/s only
