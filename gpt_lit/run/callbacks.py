"""The callbacks every run gets: the random generators in every checkpoint, so that a resumed run draws the same
dropout masks (``RNGState``; Lightning saves none), and a stop at the first NaN or infinite loss (``FiniteLoss``)."""

import io
import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from gpt_lit.distributed import gather_objects
from gpt_lit.errors import GptLitError
from gpt_lit.run.last_checkpoint import LastCheckpoint


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

    restored: dict[str, Any] | None = None  # the checkpoint's states, until put back

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


class FiniteLoss(Callback):
    """Raise a GptLitError naming the step (and process) at a NaN or infinite loss, in ``on_before_backward`` so that
    the step changes no weight and nothing is saved after it; one all-gather a step stops every process together."""

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        losses = loss.detach().float().reshape(1)
        if trainer.world_size > 1:
            losses = trainer.strategy.all_gather(losses).reshape(-1)
        if len(bad := (~torch.isfinite(losses)).nonzero()) == 0:
            return
        rank = int(bad[0])
        where = f", process {rank} of {trainer.world_size}" if trainer.world_size > 1 else ""
        if wait := getattr(trainer.strategy.checkpoint_io, "wait", None):  # saves written in the background
            wait()  # the message names the files as they will stay
        last = next((c.saved_path for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint)), None)
        kept = f"the last good checkpoint is {last}" if last else "no checkpoint had been saved yet"
        raise GptLitError(f"the training loss is {losses[rank].item()} at step {trainer.global_step} (epoch "
                          f"{trainer.current_epoch}, batch {trainer.fit_loop.epoch_loop.batch_idx}{where}); training "
                          f"stopped before that update and {kept}. Try a smaller model.lr")  # fmt: skip
