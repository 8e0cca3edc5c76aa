"""Checkpoint files, read before Lightning restores them (there, readable, of the configured architecture, loaded with
``weights_only`` unless the reader trusts it: unpickling runs any code a file carries) and written on Lightning's
``TorchCheckpointIO`` and ``AsyncCheckpointIO`` (on a thread beside training, to a temporary file beside the checkpoint,
renamed over it: a failed save leaves the previous whole)."""

import dataclasses
import errno
import io
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from fsspec.utils import get_protocol
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

from gpt_lit.errors import GptLitError, cli_key, one_line, say
from gpt_lit.model import GPTConfig

# GPTConfig: in the checkpoint of a GPTLightning made in Python. Process-wide, so Lightning's restore accepts it too.
torch.serialization.add_safe_globals([GPTConfig])

TRUST_OPTION = "--trust_checkpoint true"
TRUST_HELP = ("Load a checkpoint that holds more than tensors and plain data as the pickle it is: only for a file you "
              "trust, as unpickling it runs whatever code it carries. Given per command; not recorded in the run's "
              "config.yaml.")  # fmt: skip


def config_fields(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config) if isinstance(config, dict) else {}


def refusal(path: str, error: BaseException) -> str:
    """The ``error:`` line for a checkpoint that ``weights_only`` refused, naming what it would have created."""
    message = str(error)
    found = re.search(r"GLOBAL (\S+) (?:was not an allowed global|whose module)|got <class '([^']+)'>", message)
    told = one_line(message.split("WeightsUnpickler error:")[-1]) or type(error).__name__  # torch's own words
    needs = found and (found[1] or found[2]) or told
    return (f"checkpoint {path} was not loaded: it needs {needs}, which is not plain data (tensors, numbers, strings, "
            f"containers), and unpickling it would run code from the file; if you trust the file and where it came "
            f"from, add {TRUST_OPTION}")  # fmt: skip


def read_checkpoint(path: str, trust: bool = False) -> tuple[dict[str, Any], bool]:
    """The checkpoint at ``path`` (memory-mapped) and whether it needed ``trust``; a GptLitError if it can't be read."""
    if not Path(path).exists():
        raise GptLitError(f"checkpoint {path} does not exist")
    unreadable = f"{path} is not a readable checkpoint: truncated, or not a PyTorch file"
    if not zipfile.is_zipfile(path):  # text, empty, cut short: torch.load's message would be about mmap
        raise GptLitError(f"{unreadable} (not a complete zip archive, as every checkpoint is)")
    try:
        try:
            ckpt, trusted = torch.load(path, map_location="cpu", mmap=True, weights_only=True), False
        except pickle.UnpicklingError as e:
            if not trust:
                raise GptLitError(refusal(path, e)) from None
            ckpt, trusted = torch.load(path, map_location="cpu", mmap=True, weights_only=False), True
            say("warning", f"checkpoint {path} was loaded as code ({TRUST_OPTION}): any code it carries has run")
    except GptLitError:
        raise
    except Exception as e:  # a zip archive of something else
        raise GptLitError(f"{unreadable} ({one_line(e).split('. ')[0] or type(e).__name__})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise GptLitError(f"{path} is a PyTorch file but not a Lightning checkpoint (it has no state_dict)")
    return ckpt, trusted


def check_architecture(path: str, theirs: dict[str, Any], saved: dict[str, tuple], model: LightningModule) -> None:
    """Raise a GptLitError naming the GPTConfig fields (but dropout) and tensor shapes that differ from the file's."""
    ours, wanted = config_fields(model.hparams.get("config")), model.state_dict()
    details = [f"{cli_key(k)} is {theirs[k]!r} in the checkpoint but {ours[k]!r} here"
               for k in ours if k in theirs and k != "dropout" and theirs[k] != ours[k]]  # fmt: skip
    shapes = [f"{k} {list(saved[k])} vs {list(v.shape)}" for k, v in wanted.items() if saved.get(k, v.shape) != v.shape]
    missing, unexpected = [k for k in wanted if k not in saved], [k for k in saved if k not in wanted]
    if shapes:
        details.append("shapes differ: " + ", ".join(shapes[:3]) + (", ..." if len(shapes) > 3 else ""))
    if missing:
        details.append(f"{len(missing)} tensors missing from the checkpoint (e.g. {missing[0]})")
    if unexpected:
        details.append(f"{len(unexpected)} tensors the model does not have (e.g. {unexpected[0]})")
    run_config = Path(path).parent.parent / "config.yaml"  # <run>/checkpoints/last.ckpt -> <run>/config.yaml
    hint = f"; use the run's own config: --config {run_config}" if run_config.is_file() else ""
    if details:
        raise GptLitError(f"checkpoint {path} is of a different architecture than the config: {'; '.join(details)}"
                          f"{hint}")  # fmt: skip


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
