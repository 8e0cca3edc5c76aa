"""Checkpoint files: ``last.ckpt`` after every epoch, the best epoch beside it, never a half-written file.

Two pieces, which the CLI puts into every ``fit``:

- ``AtomicCheckpointIO`` writes each checkpoint to a temporary file in its own folder, flushes and fsyncs it,
  then renames it over the old one: a save that fails (a full disk, a killed process) leaves the previous
  checkpoint whole. A full disk ends the run with one line naming the folder, the bytes the checkpoint needs
  and the last good checkpoint.
- ``EpochCheckpoint`` is Lightning's ``ModelCheckpoint`` with one difference: ``last.ckpt`` is the latest
  completed epoch, every epoch (Lightning 2.6 writes it only in the epochs that also save a top-k checkpoint,
  so after the best epoch it stops moving). When the latest epoch is also the best, ``last.ckpt`` is a hard
  link to the best checkpoint: one file's bytes on disk, one write instead of two.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn

from gpt_lit.errors import GptLitError

NO_ROOM = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # disk full, file size limit, quota


def last_good_checkpoint(folder: Path) -> Path | None:
    """``last.ckpt`` in ``folder`` if there is one, else the newest ``.ckpt`` there (None if none)."""
    if (folder / "last.ckpt").is_file():
        return folder / "last.ckpt"
    saved = [p for p in folder.glob("*.ckpt") if p.is_file()]
    return max(saved, key=lambda p: p.stat().st_mtime) if saved else None


def write_atomically(data: memoryview, path: Path) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder: write, fsync, rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; a checkpoint has the usual mode
            while data:
                data = data[os.write(fd, data[: 1 << 26]) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:  # folders cannot be opened on some systems (Windows); the file itself is synced
        pass


def link_atomically(target: Path, link: Path) -> None:
    """Make ``link`` a hard link to ``target``, replacing what was there in one rename (never a missing file)."""
    if link.exists() and os.path.samefile(target, link):
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    os.link(target, tmp)
    try:
        os.replace(tmp, link)
    finally:
        tmp.unlink(missing_ok=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a temporary file beside the checkpoint, fsync, rename; ``bytes_written`` counts."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes_written = 0  # what this process's saves wrote, in bytes

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote: fsspec's transaction
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()  # serialized first (as Lightning does), so the size is known before writing
        torch.save(checkpoint, buffer)
        data = buffer.getbuffer()
        try:
            write_atomically(data, path)
        except OSError as e:
            if e.errno not in NO_ROOM:
                raise
            free = shutil.disk_usage(path.parent).free
            last = last_good_checkpoint(path.parent)
            kept = f"the last good checkpoint is {last}" if last else "no checkpoint had been saved before"
            raise GptLitError(
                f"no room to save checkpoint {path.name} in {path.parent} ({e.strerror}): it needs {len(data):,} "
                f"bytes there ({free:,} free; the new file is written beside the old one before replacing it, so "
                f"for a moment both take room); {kept}. Free some room, or log elsewhere with "
                f"--trainer.logger.init_args.save_dir, and resume from it with --ckpt_path"
            ) from None
        self.bytes_written += len(data)


class EpochCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, but ``last.ckpt`` is always the latest epoch (a hard link when it is the best).

    Every argument is ModelCheckpoint's; ``save_last`` defaults to True. With ``monitor`` (and ``save_top_k``)
    it also keeps the best epochs, as ModelCheckpoint does. Resuming from ``last.ckpt`` is exact whether it
    was written or linked: a linked one is the very checkpoint of the same step.
    """

    def __init__(self, *args: Any, save_last: bool | None = True, **kwargs: Any) -> None:
        super().__init__(*args, save_last=save_last, **kwargs)
        self._last_step = -1  # the global step last.ckpt was saved at

    def _last_path(self, trainer: L.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> str:
        """ModelCheckpoint's name for last.ckpt (a version suffix only beside another run's last.ckpt)."""
        filepath = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
        if self._enable_version_counter:
            version = self.STARTING_VERSION
            while self.file_exists(filepath, trainer) and filepath != self.last_model_path:
                filepath = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST, ver=version)
                version += 1
        return filepath

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        if self.save_last:
            # The best file may become last.ckpt (a link): it must already name last.ckpt as the last model,
            # as Lightning's own last.ckpt would, so that a run resumed from it keeps writing last.ckpt.
            self.last_model_path = self._last_path(trainer, monitor_candidates)
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        if not self.save_last:
            return
        filepath = self._last_path(trainer, monitor_candidates)
        previous, self.last_model_path = self.last_model_path, filepath
        if self._last_step == trainer.global_step and previous == filepath:
            return  # already saved at this step
        # A top-k checkpoint saved at this very step is the same state: link to it instead of writing again.
        saved_now = self._last_global_step_saved == trainer.global_step
        same_state = saved_now and self._last_checkpoint_saved not in ("", filepath)
        if not (same_state and self._link(trainer, filepath)):
            self._save_checkpoint(trainer, filepath)
        self._last_step = trainer.global_step
        if previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._remove_checkpoint(trainer, previous)

    def _link(self, trainer: L.Trainer, filepath: str) -> bool:
        """Hard-link last.ckpt to the checkpoint this step saved; False where links are impossible."""
        if not (_is_local_file_protocol(filepath) and _is_local_file_protocol(self._last_checkpoint_saved)):
            return False
        linked = True
        if trainer.is_global_zero:
            try:
                link_atomically(Path(self._last_checkpoint_saved), Path(filepath))
            except OSError:  # a filesystem without hard links: write the file instead
                linked = False
        return trainer.strategy.broadcast(linked)

    def _save_last_if_behind(self, trainer: L.Trainer) -> None:
        if (
            self.save_last
            and self._last_step != trainer.global_step
            and trainer.state.fn == TrainerFn.FITTING
            and not trainer.sanity_checking
            and not trainer.fast_dev_run
        ):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_behind(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_behind(trainer)
