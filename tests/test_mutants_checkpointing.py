"""AtomicCheckpointIO's cases the training runs rarely reach: a folder that does not exist yet, a remote path, a full
disk before any checkpoint, and what is written or removed after a save that found no room. In milliseconds, so that
mutation testing (docs/testing.md) runs these for every mutant of gpt_lit/run/checkpoints.py."""

from pathlib import Path

import fsspec
import pytest
import torch
from test_checkpointing import file_size_limit

from gpt_lit.run.checkpoints import AtomicCheckpointIO, NoRoomError


def test_a_checkpoint_goes_into_folders_made_for_it(tmp_path):
    path = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 1, "w": torch.ones(10)}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 1


def test_a_remote_path_is_saved_by_fsspec_and_storage_options_are_refused_as_lightning_does(tmp_path):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 3}, "memory://gpt_lit_test/run/last.ckpt")
    with fsspec.open("memory://gpt_lit_test/run/last.ckpt", "rb") as f:
        assert torch.load(f, weights_only=True) == {"global_step": 3}
    assert not Path("memory:").exists()
    with pytest.raises(TypeError, match="storage_options"):  # TorchCheckpointIO's own refusal
        io.save_checkpoint({"global_step": 3}, tmp_path / "last.ckpt", storage_options={"x": 1})


def test_a_full_disk_before_any_checkpoint_says_so_in_one_line(tmp_path):
    io = AtomicCheckpointIO()
    with file_size_limit(0):
        io.save_checkpoint({"global_step": 2}, tmp_path / "last.ckpt")
    message = str(io.failed)
    assert message.startswith(f"no room to save checkpoint last.ckpt in {tmp_path} (File too large): it ")
    assert message.endswith(
        "; no checkpoint had been saved before. Free some room, or log elsewhere with "
        "--trainer.logger.init_args.save_dir, and resume from it with --ckpt_path"
    )


def test_after_a_save_that_found_no_room_nothing_is_written_or_removed_and_its_error_is_given_once(tmp_path):
    io = AtomicCheckpointIO()
    old = tmp_path / "best-epoch01.ckpt"
    io.save_checkpoint({"global_step": 1}, old)
    io.remove_checkpoint(old)  # no save failed: removed, as a ModelCheckpoint removes its previous best
    assert not old.exists()
    io.save_checkpoint({"global_step": 1}, old)
    with file_size_limit(0):
        io.save_checkpoint({"global_step": 2}, tmp_path / "best-epoch02.ckpt")  # kept, not raised (see LastCheckpoint)
    io.save_checkpoint({"global_step": 3}, tmp_path / "best-epoch03.ckpt")  # room again: still nothing written
    io.remove_checkpoint(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-epoch01.ckpt"]
    assert isinstance(io.failed, NoRoomError) and "best-epoch02.ckpt" in str(io.failed)  # the first failure
    assert io.failure() is io.failed and io.failure() is None
    io.teardown()  # given already: not raised again
