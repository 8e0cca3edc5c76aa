"""FLOPs a step does, and the matmul rate a machine reaches: the two halves of MFU (model FLOPs utilisation), counted
alike by ``scripts/bench.py``, ``scripts/time_run.py`` and the ``Throughput`` callback. N is the weights that do
matmuls (``matmul_params``) or, given, every parameter; the peak is the rate of a square ``torch.mm``."""

import functools
import statistics
import time
from collections.abc import Callable

import torch

from gpt_lit.model import GPTConfig


def matmul_params(cfg: GPTConfig) -> int:
    """N: weights that do matmuls: per block qkv 3d^2 + proj d^2 + fc 4d^2 + proj 4d^2, plus the head V d."""
    return cfg.n_layers * 12 * cfg.emb_dim**2 + cfg.vocab_size * cfg.emb_dim


def train_flops_per_token(cfg: GPTConfig, seq_len: int, n_params: int | None = None) -> int:
    """6 N (forward 2 N, backward 4 N) + 12 n_layers T emb_dim (attention's scores and weighted sums over T positions,
    as in the PaLM paper)."""
    n = matmul_params(cfg) if n_params is None else n_params
    return 6 * n + 12 * cfg.n_layers * seq_len * cfg.emb_dim


def eval_flops_per_token(cfg: GPTConfig, seq_len: int, n_params: int | None = None) -> int:
    """The forward pass alone: 2 N + 4 n_layers T emb_dim."""
    n = matmul_params(cfg) if n_params is None else n_params
    return 2 * n + 4 * cfg.n_layers * seq_len * cfg.emb_dim


def matmul_step(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> tuple[Callable[[], None], int]:
    """``reps`` (n x n) @ (n x n) products per call, and their FLOPs. The matrices are drawn from a generator of
    their own: measuring the peak leaves the run's random numbers (dropout's masks) as they were."""
    generator = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, dtype=dtype, generator=generator) for _ in range(2))

    def step() -> None:
        for _ in range(reps):
            torch.mm(a, b)

    return step, 2 * n**3 * reps


def matmul_peak(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 10
) -> float:
    """FLOP/s of an (n x n) @ (n x n) ``torch.mm`` on ``device`` in ``dtype``: the median of ``reps``, after one
    warm-up."""
    device = torch.device(device)
    step, flops = matmul_step(device, dtype, n, 1)
    times = []
    for _ in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times[1:])


SLOW = 5e9  # FLOP/s: a dtype without a fast kernel on the device (bf16 on a CPU without bf16 units) runs below it


@functools.cache
def measured_peak(device: torch.device, dtype: torch.dtype, threads: int) -> float:
    """``matmul_peak`` of a 2048 x 2048 ``torch.mm`` with torch's ``threads``, the median of 3 (of one 512 x 512 one
    where that runs below ``SLOW``: a 2048 x 2048 one would take minutes); once per process."""
    small = matmul_peak(device, dtype, n=512, reps=1)
    return small if small < SLOW else matmul_peak(device, dtype, reps=3)
