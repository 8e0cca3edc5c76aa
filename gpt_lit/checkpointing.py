"""Checkpoint files: ``last.ckpt`` is always the newest state a run can resume from exactly; never half-written.

Three pieces, which the CLI puts into every ``fit``:

- ``AtomicCheckpointIO`` writes each checkpoint to a temporary file in its own folder, flushes and fsyncs it,
  then renames it over the old one: a save that fails (a full disk, a killed process) leaves the previous
  checkpoint whole. A full disk ends the run with one line naming the folder, the bytes the checkpoint needs
  and the last good checkpoint. Under ``AsyncCheckpointIO`` it is the plugin that does the writing.
- ``BackgroundCheckpointIO`` runs those saves on a thread of their own while training goes on: the training
  thread only copies the state's tensors (``snapshot``); serializing, writing, fsyncing, renaming and linking
  happen beside it (gpt_lit/checkpoint_thread.py).
- ``LastCheckpoint`` (gpt_lit/callbacks/last_checkpoint.py) owns ``last.ckpt``: it saves it at the end of every
  epoch, after a step where another checkpoint callback saved (a step or time interval), when Ctrl-C or SIGTERM
  stops the run, and at the end of ``fit``. Best and top-k files are Lightning's ``ModelCheckpoint``'s.
"""

from __future__ import annotations

import errno
import hashlib
import io
import mmap
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch
from fsspec.utils import get_protocol
from lightning.pytorch.plugins.io import TorchCheckpointIO

from gpt_lit.errors import GptLitError

try:
    import fcntl
except ImportError:  # Windows: no O_DIRECT either
    fcntl = None  # type: ignore[assignment]

NO_ROOM = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # disk full, file size limit, quota
# Writes past the page cache (``write_uncached``): O_DIRECT wants the memory address, the file offset and the length
# in whole blocks of the filesystem's (512 or 4096 bytes); STAGE bytes at a time are copied into an aligned buffer.
BLOCK, STAGE = 4096, 4 << 20


def is_local(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file on this machine (no ``s3://``-like protocol): fsspec's own protocol check."""
    return get_protocol(str(path)) == "file"


def read_umask() -> int:
    """The process's umask as it is now, from Linux's /proc; elsewhere the one read at import (``UMASK``): outside
    /proc, reading it means setting it for a moment, and another thread (a background save, a DataLoader thread)
    creating a file in that moment would get that mode."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    if "UMASK" in globals():
        return UMASK
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


UMASK = read_umask()


class NoRoomError(GptLitError):
    """A checkpoint did not fit on the disk (or under a size limit or quota); the previous one is whole."""


def last_good_checkpoint(folder: Path) -> Path | None:
    """``last.ckpt`` in ``folder`` if there is one, else the newest ``.ckpt`` there (None if none)."""
    if (folder / "last.ckpt").is_file():
        return folder / "last.ckpt"
    saved = [p for p in folder.glob("*.ckpt") if p.is_file()]
    return max(saved, key=lambda p: p.stat().st_mtime) if saved else None


def several_processes() -> bool:
    """Whether this process is one of several (torch.distributed initialized with more than one)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def write_atomically(data: memoryview, path: Path) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder: write, fsync, rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        try:
            os.fchmod(fd, 0o666 & ~read_umask())  # mkstemp makes the file private; a checkpoint has the usual mode
            data = data[write_uncached(fd, data) :]
            while data:  # the last partial block, or all of it where the filesystem has no O_DIRECT
                data = data[os.write(fd, data[: 1 << 26]) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def write_uncached(fd: int, data: memoryview) -> int:
    """Write the whole blocks at the start of ``data`` to ``fd`` past the page cache (Linux's O_DIRECT); the number
    of bytes written (0 where the system or the filesystem has no O_DIRECT: macOS, Windows, some filesystems).

    A checkpoint is read again only to resume, and put through the page cache it first takes 347 MB of fresh
    pages there at every save: on a VM whose host takes back the guest's free memory, that is kernel time on the
    CPUs training runs on (docs/performance.md). A refused write stops it where it is:
    the caller writes the rest through the page cache, where a full disk raises its error."""
    o_direct = getattr(os, "O_DIRECT", 0)
    whole = len(data) - len(data) % BLOCK
    if not (o_direct and fcntl and whole):
        return 0
    try:
        stage = mmap.mmap(-1, min(STAGE, whole))  # page-aligned memory
    except OSError:  # no memory for it: the page cache
        return 0
    done = 0
    with stage, memoryview(stage) as view:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | o_direct)
        except OSError:  # the filesystem has no O_DIRECT
            return 0
        try:
            while done < whole:
                n = min(len(view), whole - done)
                view[:n] = data[done : done + n]
                with view[:n] as chunk:  # released even where an error keeps the write's frame
                    done += os.write(fd, chunk)  # a short write leaves ``done`` where the next one starts
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: a filesystem that takes the flag but not this write, or an
                raise  # offset out of step after a short write
        finally:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return done


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:  # folders cannot be opened on some systems (Windows); the file itself is synced
        pass


def file_identity(path: Path) -> tuple[int, int, int, int] | None:
    """What tells one file from another, and a rewritten file from itself: (device, inode, size, mtime in ns);
    None if there is no file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def link_atomically(source: Path, path: Path) -> bool:
    """Make ``path`` a second name of the file ``source`` (a hard link), replacing what was there in one rename.
    False, with nothing changed, where the filesystem has no hard links or the two are on different ones."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.link"  # os.link creates it
    try:
        os.link(source, tmp)
    except OSError:
        return False
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    return True


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a temporary file beside the checkpoint, fsync, rename; ``bytes_written`` counts.

    A checkpoint byte for byte the same as the one this plugin saved last (the best file and ``last.ckpt`` of
    the same epoch's end) becomes a hard link to it: one copy on disk. As every save replaces its file by a
    rename, a name saved again or deleted later leaves the other name's file as it was. "The same bytes" is
    told without reading the file back: the SHA-256 of the bytes serialized now against that of the bytes
    written last, while that file is still the one written (the same inode, size and modification time).
    """

    def __init__(self) -> None:
        super().__init__()
        self.bytes_written = 0  # what this process's saves wrote, in bytes
        self.saved_last: tuple[Path, int | None] | None = None  # (path, global step) of the latest save
        self.failed: NoRoomError | None = None  # under several processes, a save that found no room, until raised
        self.saved_digest: tuple[bytes, tuple[int, int, int, int] | None] | None = None  # the latest save's
        # SHA-256 and its file's identity (file_identity) just after it was written

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote: fsspec's transaction
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()  # serialized first (as Lightning does), so the size is known before writing
        torch.save(checkpoint, buffer)
        data = buffer.getbuffer()
        step = checkpoint.get("global_step")
        digest = hashlib.sha256(data).digest()  # releases the GIL: training goes on beside a background save
        if self.saved_last is not None and self.saved_last[1] == step and self.still_holds(digest):
            if link_atomically(self.saved_last[0], path):  # the same state again: a second name for the file
                self.saved_last = (path, step)
                return
        try:
            write_atomically(data, path)
        except OSError as e:
            if e.errno not in NO_ROOM:
                raise
            free = shutil.disk_usage(path.parent).free
            last = last_good_checkpoint(path.parent)
            kept = f"the last good checkpoint is {last}" if last else "no checkpoint had been saved before"
            error = NoRoomError(
                f"no room to save checkpoint {path.name} in {path.parent} ({e.strerror}): it needs {len(data):,} "
                f"bytes there ({free:,} free; the new file is written beside the old one before replacing it, so "
                f"for a moment both take room); {kept}. Free some room, or log elsewhere with "
                f"--trainer.logger.init_args.save_dir, and resume from it with --ckpt_path"
            )
            if several_processes():
                # Only process 0 writes; the others wait for it in the save's barrier, and an error raised here alone
                # would leave them waiting. LastCheckpoint raises it on every process at its next save; until then
                # no checkpoint is removed (remove_checkpoint), as the one that failed did not take its place.
                self.failed = self.failed or error
                return
            raise error from None
        self.bytes_written += len(data)
        self.saved_last = (path, step)
        self.saved_digest = (digest, file_identity(path))

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Remove ``path``, unless a save failed since: a ModelCheckpoint removes its previous best or top-k
        file after saving the new one, and under several processes a failed save does not raise at once (see
        ``failed``); the file it would have replaced stays."""
        if self.failed is None:
            super().remove_checkpoint(path)

    def still_holds(self, digest: bytes) -> bool:
        """Whether the file saved last holds the bytes whose SHA-256 is ``digest``: the same digest as when it was
        written, and the file still that one, untouched since."""
        if self.saved_last is None or self.saved_digest is None:
            return False
        written, identity = self.saved_digest
        return written == digest and identity is not None and file_identity(self.saved_last[0]) == identity
