"""What the diagnostics that run the model on a fixed batch of validation windows share: when, where, how."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.block_pass import SHARED_PASS, BlockRecord
from gpt_lit.callbacks.tensorboard_log import is_fresh_start
from gpt_lit.distributed import shards_parameters
from gpt_lit.model import GPT


class ThreadChoice:
    """How many of torch's threads the diagnostics' passes use: all of training's, if training's own threads had
    their cores, else one.

    The passes are small (a few windows, or one token at a time). With the CPU to itself, a run's threads make
    them faster than one; with another program busy on a core, the same threads wait for each other and make
    them slower than one (docs/performance.md). Whether the cores were free shows in the run
    itself: the CPU time this process got per second of wall time since the last choice (the epoch's training
    and evaluation), against its ``threads``. The first choice, with nothing measured yet, is one thread; a choice
    holds for ``interval`` seconds, so the diagnostics of one epoch's end share it.
    """

    def __init__(self, interval: float = 5.0, share: float = 0.75):
        self.interval = interval  # seconds of wall time a choice holds, and the least a measurement spans
        self.share = share  # the part of ``threads`` CPU-seconds per second that counts as the cores being free
        self.since: tuple[float, float] | None = None  # (wall, CPU) clocks when the last choice was made
        self.chosen = 1

    def __call__(self, threads: int) -> int:
        wall, cpu = time.perf_counter(), time.process_time()
        if self.since is None or wall - self.since[0] >= self.interval:
            if self.since is not None:
                got = (cpu - self.since[1]) / (wall - self.since[0])  # CPU-seconds per second: ~threads when free
                self.chosen = threads if got > self.share * threads else 1
            self.since = (wall, cpu)
        return min(self.chosen, threads)


_THREAD_CHOICE = ThreadChoice()  # one per process: every diagnostic of a run reads the same clocks


@contextmanager
def diagnostic_threads() -> Iterator[None]:
    """torch's threads for the diagnostics' passes as ``ThreadChoice`` says, training's number again after."""
    threads = torch.get_num_threads()
    inside = _THREAD_CHOICE(threads) if threads > 1 else threads
    if inside != threads:
        torch.set_num_threads(inside)
    try:
        yield
    finally:
        if inside != threads:
            torch.set_num_threads(threads)


class ValidationProbe(AfterValidation):
    """Runs the model on the first ``num_sequences`` validation windows (a fixed batch) after every validation of
    ``fit`` (``AfterValidation``), at the step of its ``loss/val``, and at the start of a fresh run when
    ``at_start``; on the main process, on ``diagnostic_threads``, in eval mode without gradients, then back in the
    mode it was in. A subclass says what to ``measure`` and how to ``record`` it. ``history`` (one entry per
    measurement, for figures that draw every validation so far) goes into checkpoints, so a resumed run's figures
    keep the validations before the stop. Skipped, with one logged line, under
    strategies that shard the parameters (the model cannot be run outside their own forward). A probe that needs
    the blocks' inputs and outputs asks ``blocks``: the probes of one moment share one pass (``SharedPass``).
    """

    at_start = True  # also measure at the start of a fresh run ("epoch" 0)
    with_targets = False  # the batch is (inputs, targets), else the inputs alone

    def __init__(self, num_sequences: int):
        self.num_sequences = num_sequences
        self.batch: Any = None  # (n, T) token IDs, or a pair of them with the targets
        self.history: list[dict[str, Any]] = []  # in checkpoints
        self.active = True
        self.moment: tuple[int, float] = (0, 0)  # (step, epoch) of the measurement being made

    def blocks(self, model: GPT, idx: torch.Tensor) -> BlockRecord:
        """What every block read and wrote on the token IDs ``idx``, from the pass this moment's probes share."""
        return SHARED_PASS(model, idx, self.moment)

    def measure(self, model: GPT, batch: Any) -> Any:
        """What this diagnostic computes from the model on the batch (already on the model's device)."""
        raise NotImplementedError

    def record(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float, values: Any) -> None:
        """Log ``values`` (and keep what figures need in ``history``) at ``step``, after ``epoch`` epochs (0: the
        start; a fraction: a validation within an epoch)."""
        raise NotImplementedError

    def prepare(self, trainer: L.Trainer) -> None:
        """At the start of fit, once the batch is chosen: anything else this diagnostic needs from the data."""

    def _probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> None:
        if not trainer.loggers or trainer.sanity_checking or not trainer.is_global_zero:
            return
        batch = (
            tuple(t.to(pl_module.device) for t in self.batch) if self.with_targets else self.batch.to(pl_module.device)
        )
        self.moment = (step, epoch)
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.no_grad(), diagnostic_threads():
                values = self.measure(pl_module.model, batch)
        finally:
            pl_module.train(was_training)
        self.record(trainer, pl_module, step, epoch, values)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.active = not shards_parameters(trainer, type(self).__name__)
        val = trainer.datamodule.val_set
        windows = [val[i] for i in range(min(self.num_sequences, len(val)))]
        inputs = torch.stack([x for x, _ in windows])  # (n, T)
        self.batch = (inputs, torch.stack([y for _, y in windows])) if self.with_targets else inputs
        self.prepare(trainer)
        if self.active and self.at_start and is_fresh_start(trainer):  # a resumed run logged its start already
            self._probe(trainer, pl_module, step=0, epoch=0)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        SHARED_PASS.clear()  # another model, or this one loaded from a checkpoint

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        SHARED_PASS.clear()  # the weights are about to change; and the record's memory is freed

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        if self.active:
            self._probe(trainer, pl_module, step=validation.step, epoch=validation.epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
