"""Checkpoint files on Lightning's ``TorchCheckpointIO`` and ``AsyncCheckpointIO``: written on a thread beside
training to a temporary file beside the checkpoint, renamed over it, so that a failed save leaves the previous whole."""

import errno
import io
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from fsspec.utils import get_protocol
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

from gpt_lit.errors import GptLitError

NO_ROOM = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # disk full, file size limit, quota


class NoRoomError(GptLitError):
    """A checkpoint did not fit on the disk (or under a size limit or quota); the previous one is whole."""


REMOVE = object()  # what BackgroundCheckpointIO asks its thread to "save" for a removal


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with the temporary file beside the checkpoint (Lightning's is in the system's temporary
    folder: a move to another filesystem copies over the old file); after a save that found no room (``failed``),
    nothing is written or removed, so that ModelCheckpoint's previous best stays."""

    failed: NoRoomError | None = None
    reported = False  # failed handed out to be raised (failure)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if checkpoint is REMOVE:
            self.remove_checkpoint(path)
        elif storage_options is not None or get_protocol(str(path)) != "file":
            super().save_checkpoint(checkpoint, path, storage_options)  # remote: fsspec's transaction
        elif self.failed is None:
            self.write(checkpoint, Path(path))

    def write(self, checkpoint: dict[str, Any], path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.part")
        try:
            with open(part, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())  # on the disk before it takes the name
            os.replace(part, path)
        except (OSError, RuntimeError) as e:
            part.unlink(missing_ok=True)
            error = e if isinstance(e, OSError) else e.__context__  # torch's zip writer raises over the write's error
            if not isinstance(error, OSError) or error.errno not in NO_ROOM:
                raise
            size = io.BytesIO()
            torch.save(checkpoint, size)  # the line gives the size the file needs
            saved = sorted((p for p in path.parent.glob("*.ckpt") if p.is_file()),
                           key=lambda p: (p.name == "last.ckpt", p.stat().st_mtime))  # fmt: skip
            kept = f"the last good checkpoint is {saved[-1]}" if saved else "no checkpoint had been saved before"
            self.failed = NoRoomError(
                f"no room to save checkpoint {path.name} in {path.parent} ({error.strerror}): it needs "
                f"{size.getbuffer().nbytes:,} bytes there ({shutil.disk_usage(path.parent).free:,} free; the new file "
                f"is written beside the old one before replacing it, so for a moment both take room); {kept}. Free "
                f"some room, or log elsewhere with --trainer.logger.init_args.save_dir, and resume from it with "
                f"--ckpt_path")  # fmt: skip

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        if self.failed is None:
            super().remove_checkpoint(path)

    def failure(self) -> NoRoomError | None:
        """The save that found no room, the first time it is asked for (to be raised once)."""
        if self.reported:
            return None
        self.reported = self.failed is not None
        return self.failed

    def teardown(self) -> None:
        if failed := self.failure():
            raise failed


class BackgroundCheckpointIO(AsyncCheckpointIO):
    """``AsyncCheckpointIO`` whose removals queue behind the saves asked before them (Lightning's removes at once,
    and ModelCheckpoint removes its previous best just after asking for the new one)."""

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        super().save_checkpoint(REMOVE, path)

    wait = AsyncCheckpointIO.teardown  # every save asked so far written (and a save's exception raised)

    def teardown(self) -> None:
        super().teardown()
        self.checkpoint_io.teardown()  # the wrapped plugin's failure, which Lightning's does not raise
