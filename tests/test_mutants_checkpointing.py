"""AtomicCheckpointIO's cases the training runs rarely reach: a folder that does not exist yet, a remote path, a state
saved under three names, a full disk under several processes (the old file stays until the error is raised), the
umask where /proc cannot be read. In milliseconds, so that mutation testing (docs/testing.md) runs these for every
mutant of gpt_lit/checkpointing.py."""

import errno
import os
from pathlib import Path

import fsspec
import pytest
import torch

from gpt_lit import checkpointing
from gpt_lit.checkpointing import AtomicCheckpointIO, NoRoomError


def test_a_checkpoint_goes_into_folders_made_for_it_and_each_save_counts_its_bytes(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.ones(10)}, path)
    io.save_checkpoint({"global_step": 2, "w": torch.ones(1000)}, tmp_path / "best.ckpt")
    assert torch.load(path, weights_only=True)["global_step"] == 1
    assert io.bytes_written == path.stat().st_size + (tmp_path / "best.ckpt").stat().st_size


def test_a_remote_path_is_saved_by_fsspec_and_storage_options_are_refused_as_lightning_does(tmp_path):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 3}, "memory://gpt_lit_test/run/last.ckpt")
    with fsspec.open("memory://gpt_lit_test/run/last.ckpt", "rb") as f:
        assert torch.load(f, weights_only=True) == {"global_step": 3}
    assert not Path("memory:").exists()
    with pytest.raises(TypeError, match="storage_options"):  # TorchCheckpointIO's own refusal
        io.save_checkpoint({"global_step": 3}, tmp_path / "last.ckpt", storage_options={"x": 1})


def test_the_same_state_under_three_names_is_one_file(tmp_path):
    io = AtomicCheckpointIO()
    state = {"global_step": 4, "w": torch.arange(1000.0)}
    for name in ("best.ckpt", "last.ckpt", "epoch=1.ckpt"):
        io.save_checkpoint(state, tmp_path / name)
    assert len({(tmp_path / name).stat().st_ino for name in ("best.ckpt", "last.ckpt", "epoch=1.ckpt")}) == 1


def no_room(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_before_any_checkpoint_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpointing.os, "write", no_room)
    with pytest.raises(NoRoomError) as failed:
        AtomicCheckpointIO().save_checkpoint({"global_step": 2}, tmp_path / "last.ckpt")
    message = str(failed.value)
    assert message.startswith(f"no room to save checkpoint last.ckpt in {tmp_path} (No space left on device): it ")
    assert message.endswith(
        "; no checkpoint had been saved before. Free some room, or log elsewhere with "
        "--trainer.logger.init_args.save_dir, and resume from it with --ckpt_path"
    )


def test_under_several_processes_a_full_disk_waits_and_keeps_the_old_files(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    old = tmp_path / "best-epoch01.ckpt"
    io.save_checkpoint({"global_step": 1}, old)
    io.remove_checkpoint(old)  # no save failed: removed, as a ModelCheckpoint removes its previous best
    assert not old.exists()
    io.save_checkpoint({"global_step": 1}, old)
    monkeypatch.setattr(checkpointing, "several_processes", lambda: True)
    monkeypatch.setattr(checkpointing.os, "write", no_room)
    io.save_checkpoint({"global_step": 2}, tmp_path / "best-epoch02.ckpt")  # no raise: the others wait at a barrier
    io.save_checkpoint({"global_step": 3}, tmp_path / "best-epoch03.ckpt")
    assert isinstance(io.failed, NoRoomError) and "best-epoch02.ckpt" in str(io.failed)  # the first failure
    io.remove_checkpoint(old)
    assert old.is_file()


def test_one_process_in_a_process_group_raises_at_once(tmp_path, monkeypatch):
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert not checkpointing.several_processes()
        monkeypatch.setattr(checkpointing.os, "write", no_room)
        with pytest.raises(NoRoomError):
            AtomicCheckpointIO().save_checkpoint({"global_step": 2}, tmp_path / "last.ckpt")
    finally:
        dist.destroy_process_group()


def test_without_proc_the_umask_is_the_one_read_at_import(monkeypatch):
    real_read_text = Path.read_text

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc"):
            raise OSError(errno.ENOENT, "No such file or directory")
        return real_read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_proc)
    previous = os.umask(0o077 if checkpointing.UMASK != 0o077 else 0o007)  # not the one read at import
    try:
        assert checkpointing.read_umask() == checkpointing.UMASK
    finally:
        os.umask(previous)
