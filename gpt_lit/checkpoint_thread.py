"""Checkpoints saved beside training: the training thread copies the state, a thread of its own writes it.

Lightning's ``AsyncCheckpointIO`` (lightning/pytorch/plugins/io/async_plugin.py) is the base and keeps its
contract: a one-thread executor runs the wrapped plugin's ``save_checkpoint`` (``AtomicCheckpointIO``), and a failure
is raised on the training thread at the next save or at teardown. It is not used as it is, for four reasons:

- its copy of the state is ``tensor.clone()`` on the tensor's device, and other objects are not copied: a GPU
  run's copy takes GPU memory, and a list or dict that training changes later (``ModelCheckpoint``'s
  ``best_k_models``) may change while the thread pickles it. ``snapshot`` copies every tensor into new CPU
  memory (two views of one storage stay one storage: the file is the same) and deep-copies everything else;
- it deletes files at once, while the save before is still being written: ``ModelCheckpoint`` deletes the
  previous best file right after asking to save the new one, and when that save then fails (a full disk) no
  best file is left. Here deletions wait in the same queue as the saves, and none runs after a failed save;
- after a failed save it goes on writing the saves already queued: ``last.ckpt`` would name a best file that
  was never written. Here nothing is written after a failed save;
- its error stays set after it was raised, so teardown raises it a second time inside Lightning's own error
  handling, which then skips the rest of its teardown. Here an error is raised once.

Under several processes a save is waited for: only process 0 writes, and the others learn of a failed save from
it right after the save (``LastCheckpoint``), which needs the save done.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from gpt_lit.checkpointing import several_processes


def snapshot(checkpoint: Any) -> Any:
    """A deep copy of ``checkpoint`` that training cannot change: every tensor in new CPU memory (tensors that
    share a storage share the copy's), every container and object new. ``torch.save`` writes the same bytes for
    it as for ``checkpoint`` (bar the device tensors are recorded on: CPU)."""
    storages: dict[tuple, torch.UntypedStorage] = {}
    memo: dict[int, Any] = {}  # deepcopy's memo: id(original) -> copy, filled with the tensors' copies first

    def visit(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            if id(obj) not in memo:
                memo[id(obj)] = cpu_copy(obj, storages)
        elif isinstance(obj, dict):
            for value in obj.values():
                visit(value)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for value in obj:
                visit(value)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for field in dataclasses.fields(obj):
                visit(getattr(obj, field.name))

    visit(checkpoint)
    return copy.deepcopy(checkpoint, memo)  # what visit() did not reach is copied here (on its own device)


def cpu_copy(t: torch.Tensor, storages: dict[tuple, torch.UntypedStorage]) -> torch.Tensor:
    """``t`` detached, in new CPU memory; its storage copied once for all the tensors that view it."""
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        return t.detach().to("cpu", copy=True)
    storage = t.untyped_storage()
    key = (storage.device, storage.data_ptr(), storage.nbytes())
    if key not in storages:
        storages[key] = storage.cpu() if storage.device.type != "cpu" else storage.clone()
    return torch.empty(0, dtype=t.dtype).set_(storages[key], t.storage_offset(), t.size(), t.stride())


class BackgroundCheckpointIO(AsyncCheckpointIO):
    def __init__(self, checkpoint_io: CheckpointIO | None = None, max_queued: int = 2) -> None:
        """Save checkpoints on a thread of their own: the training thread copies the state (``snapshot``) and goes
        on; the wrapped plugin (the CLI gives ``AtomicCheckpointIO``) serializes, writes, fsyncs, renames, links.

        Saves and deletions run one at a time, in the order asked. After a save fails, nothing more is written or
        deleted, and its error is raised on the training thread once: at the next save or deletion, or when the
        trainer tears down (at the end of ``fit``, or after a stop: a stop waits for the saves asked before it).

        Args:
            checkpoint_io: The plugin that writes (``AtomicCheckpointIO`` when the CLI builds it).
            max_queued: Saves waiting or under way at most; one more waits for the oldest (each holds a copy of the
                state in memory).
        """
        super().__init__(checkpoint_io)
        self.max_queued = max_queued
        self.worker: ThreadPoolExecutor | None = None
        self.queued: deque[tuple[Future, bool]] = deque()  # (saves and deletions asked and not yet seen done, a save?)
        self.error: BaseException | None = None  # the first failed save or deletion
        self.reported = False  # whether ``error`` was raised on the training thread

    def run(self, method: str, *args: Any, **kwargs: Any) -> None:
        """On the worker thread: the wrapped plugin's ``method``, unless something before it failed."""
        if self.error is not None:
            return
        try:
            getattr(self.checkpoint_io, method)(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 (raised on the training thread: raise_error)
            self.error = e

    def submit(self, method: str, *args: Any, **kwargs: Any) -> None:
        if self.worker is None:
            self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.queued.append((self.worker.submit(self.run, method, *args, **kwargs), method == "save_checkpoint"))

    def raise_error(self) -> None:
        """Raise the error of a failed save; every time for a save or a deletion asked after it."""
        if self.error is not None:
            self.reported = True
            raise self.error

    def wait(self, keep: int = 0) -> None:
        """Wait until at most ``keep`` saves are waiting or under way (``keep`` 0: until every save and deletion is
        done). A deletion holds no copy of the state: ModelCheckpoint's deletion of the previous best file, queued
        after the new best, does not make the epoch's ``last.ckpt`` wait for the best file's write."""
        while self.queued and (keep == 0 or sum(save and not f.done() for f, save in self.queued) > keep):
            self.queued.popleft()[0].result()  # run() never raises: errors are kept in self.error

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        self.raise_error()
        if several_processes():
            self.wait()
            self.raise_error()
            assert self.checkpoint_io is not None
            return self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options)
        state = snapshot(checkpoint)
        self.wait(keep=self.max_queued - 1)
        self.submit("save_checkpoint", state, path, storage_options)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        self.raise_error()
        self.submit("remove_checkpoint", path)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.wait()  # a file being written is read once written
        return super().load_checkpoint(*args, **kwargs)

    def teardown(self) -> None:
        """Wait for every save asked; raise a failed one's error unless it was raised already. Lightning tears down
        twice when this raises (the second time in its error handling): the second finds nothing to raise."""
        self.wait()
        if self.worker is not None:
            self.worker.shutdown(wait=True)
            self.worker = None
        if self.checkpoint_io is not None:
            self.checkpoint_io.teardown()
        (error, self.error), (reported, self.reported) = (self.error, None), (self.reported, False)  # a next fit
        if error is not None and not reported:  # starts afresh
            raise error
