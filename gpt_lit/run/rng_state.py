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
    """The global generators of Python, NumPy, torch (CPU) and, when in use, CUDA."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Put back what ``rng_states`` returned."""
    random.setstate(states["python"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RNGState(Callback):
    """Store the generators' states in each checkpoint; ``fit --ckpt_path`` puts them back as training starts.

    ``seed_everything`` fixes the generators only at the start of a run. Without this, a run resumed from
    an end-of-epoch checkpoint would draw different dropout masks than the uninterrupted run; with it
    (and the data module's seed + epoch shuffle), its losses are the same. Under several processes every
    process's generators are saved (each GPU draws its own dropout masks) and each process gets its own back
    (process 0's, when the checkpoint was saved by another number of processes). The states are put back in
    ``on_train_start``, after loading and the sanity check, so nothing draws from them in between.
    The GPT CLI adds this callback to every run.
    """

    def __init__(self) -> None:
        self.restored: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": [rng_states()]}  # on_save_checkpoint adds the other processes'

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Every process builds the checkpoint (process 0 writes it), so every one takes part in the gather.
        if trainer.world_size > 1:
            buffer = io.BytesIO()
            torch.save(rng_states(), buffer)  # as bytes: all_gather_object cannot unpickle bare tensors here
            states = [torch.load(io.BytesIO(b), weights_only=True) for b in gather_objects(trainer, buffer.getvalue())]
            checkpoint["callbacks"][self.state_key] = {"ranks": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.restored is not None:
            ranks = self.restored["ranks"]
            same_processes = len(ranks) == trainer.world_size
            set_rng_states(ranks[trainer.global_rank] if same_processes else ranks[0])
            self.restored = None
