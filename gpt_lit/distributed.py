"""What changes when a run spans several processes: which strategies shard the model, and collecting results."""

from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info


def shards_parameters(trainer: L.Trainer | None, skipping: str | None = None) -> bool:
    """Whether ``trainer``'s strategy shards the parameters (FSDP, DeepSpeed ZeRO-3, ModelParallel): one read outside
    ``forward`` is a shard. A diagnostic skipped there names itself in ``skipping``, for a one-line log."""
    if trainer is None:
        return False
    strategy = trainer.strategy
    if isinstance(strategy, DeepSpeedStrategy):
        sharded = bool(getattr(strategy, "zero_stage_3", False))
    else:
        sharded = isinstance(strategy, (FSDPStrategy, ModelParallelStrategy))
    if sharded and skipping:
        rank_zero_info(f"{skipping}: skipped under {type(strategy).__name__}, which shards the parameters")
    return sharded


def gather_objects(trainer: L.Trainer, obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order (``[obj]`` on one process). Every process must call it."""
    if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * trainer.world_size
    dist.all_gather_object(out, obj)
    return out
