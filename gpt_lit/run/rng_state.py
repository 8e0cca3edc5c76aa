"""Save the random number generators in every checkpoint, so a resumed run draws the same dropout masks."""

from __future__ import annotations

import io
import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from gpt_lit.distributed import gather_objects


def rng_states() -> dict[str, Any]:
    """The global generators of Python, NumPy (its keys as a tensor: weights_only loads it), torch and CUDA."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {"python": random.getstate(), "numpy": (kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached),
              "torch": torch.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RNGState(Callback):
    """Every process's generators in each checkpoint, put back as a resumed fit starts training (after the sanity
    check), each process its own (process 0's under another number of processes)."""

    def __init__(self) -> None:
        self.restored: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": [rng_states()]}

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.world_size > 1:  # every process builds the checkpoint, so every one takes part in the gather
            buffer = io.BytesIO()
            torch.save(rng_states(), buffer)  # as bytes: all_gather_object cannot unpickle bare tensors here
            states = [torch.load(io.BytesIO(b), weights_only=True) for b in gather_objects(trainer, buffer.getvalue())]
            checkpoint["callbacks"][self.state_key] = {"ranks": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.restored is not None:
            ranks = self.restored["ranks"]
            set_rng_states(ranks[trainer.global_rank] if len(ranks) == trainer.world_size else ranks[0])
            self.restored = None
