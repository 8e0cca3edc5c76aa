"""Checkpoints written beside training (BackgroundCheckpointIO, on Lightning's AsyncCheckpointIO): the file holds the
state at the moment of the save whatever training does next; a removal waits behind the saves asked before it, and
none is made after a save that found no room; its error reaches the user once, as one line.

A plugin that writes only when the test lets it (``Gate``) makes "the thread has not written yet" a fact, not a race.
"""

import resource
import signal
import threading

import pytest
import torch
from conftest import TINY, residual_without_diagnostics
from lightning.pytorch.callbacks import Callback

from gpt_lit.run.checkpoints import AtomicCheckpointIO, BackgroundCheckpointIO, NoRoomError
from gpt_lit.run.cli import main


class Gate(AtomicCheckpointIO):
    """AtomicCheckpointIO whose saves wait until ``open`` is set; the save of a path in ``fail`` finds no room."""

    def __init__(self, fail: tuple[str, ...] = ()):
        super().__init__()
        self.open, self.fail = threading.Event(), fail

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        assert self.open.wait(timeout=30), "the test never let the save run"
        if str(path).endswith(self.fail):
            self.failed = self.failed or NoRoomError(f"no room to save checkpoint {path}")
        super().save_checkpoint(checkpoint, path, storage_options)


def test_the_file_holds_the_state_of_the_moment_of_the_save(tmp_path):
    gate = Gate()
    io = BackgroundCheckpointIO(gate)
    weights, moments = torch.arange(10_000.0), {"exp_avg": torch.ones(10_000), "step": torch.tensor(3.0)}
    state = {"state_dict": {"w": weights}, "optimizer_states": [moments], "best": {"a": 1}}
    io.save_checkpoint(state, tmp_path / "last.ckpt")
    assert not (tmp_path / "last.ckpt").exists()  # returned before writing: training goes on
    weights.mul_(-1)  # the next optimizer step, in place
    moments["exp_avg"].zero_()
    state["best"]["b"] = 2  # ModelCheckpoint's best_k_models gains an entry
    gate.open.set()
    io.teardown()  # waits for the save
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["state_dict"]["w"].equal(torch.arange(10_000.0))
    assert saved["optimizer_states"][0]["exp_avg"].equal(torch.ones(10_000)) and saved["best"] == {"a": 1}


def test_after_a_failed_save_nothing_is_written_or_removed_and_the_error_is_raised_once(tmp_path):
    gate = Gate(fail=("best-epoch01.ckpt",))
    io = BackgroundCheckpointIO(gate)
    gate.open.set()
    io.save_checkpoint({"global_step": 2, "w": torch.ones(10)}, tmp_path / "best-epoch00.ckpt")
    io.wait()
    gate.open.clear()
    # ModelCheckpoint's order: save the new best, remove the previous one; then LastCheckpoint saves last.ckpt.
    io.save_checkpoint({"global_step": 4, "w": torch.zeros(10)}, tmp_path / "best-epoch01.ckpt")
    io.remove_checkpoint(tmp_path / "best-epoch00.ckpt")
    io.save_checkpoint({"global_step": 4, "w": torch.zeros(10)}, tmp_path / "last.ckpt")
    gate.open.set()
    with pytest.raises(NoRoomError):
        io.teardown()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-epoch00.ckpt"]  # the previous best, whole
    io.teardown()  # Lightning tears down again in its error handling: raised once is enough


def test_the_epochs_last_ckpt_does_not_wait_for_the_best_files_write(tmp_path):
    # At an epoch's end ModelCheckpoint saves the new best file and removes the previous one; then LastCheckpoint
    # saves last.ckpt. The removal waits on the thread, not on training: the save of last.ckpt returns while the
    # best file is still being written, and training goes on.
    gate = Gate()
    io = BackgroundCheckpointIO(gate)
    gate.open.set()
    io.save_checkpoint({"global_step": 2, "w": torch.ones(10)}, tmp_path / "best-epoch00.ckpt")
    io.wait()
    gate.open.clear()
    state = {"global_step": 4, "w": torch.zeros(10)}
    io.save_checkpoint(state, tmp_path / "best-epoch01.ckpt")
    io.remove_checkpoint(tmp_path / "best-epoch00.ckpt")
    returned = threading.Event()
    threading.Thread(target=lambda: (io.save_checkpoint(state, tmp_path / "last.ckpt"), returned.set())).start()
    try:
        assert returned.wait(timeout=10), "the save of last.ckpt waited for the best file's write"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["best-epoch00.ckpt"]  # nothing written yet
    finally:
        gate.open.set()
    returned.wait(timeout=30)
    io.teardown()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-epoch01.ckpt", "last.ckpt"]


class FillTheDisk(Callback):
    """A file size limit below a checkpoint's size from epoch 1's first step, once epoch 0's files are written: the
    saves after fail as on a full disk."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 0:
            trainer.strategy.checkpoint_io.wait()
            resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_a_full_disk_ends_the_run_with_one_line_and_keeps_the_previous_best(tmp_path, capsys):
    # The shipped config: epoch 1 is a new best, so ModelCheckpoint asks to remove best-epoch00.ckpt after asking
    # to save best-epoch01.ckpt, which fails. The run stops with the full-disk line; epoch 0's files stay.
    limits, previous = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        with pytest.raises(SystemExit) as stopped:
            main(["fit", "--config", residual_without_diagnostics(), *TINY, "--data.eval_train", "false",
                  "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
                  "--model.lr", "0.01", "--trainer.enable_progress_bar", "false",
                  "--trainer.logger.init_args.save_dir", str(tmp_path)],
                 extra_callbacks=[FillTheDisk()])  # fmt: skip
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and err[-1].startswith("error: no room to save checkpoint "), err[-3:]
    ckpts = tmp_path / "residual" / "version_0" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["best-epoch00.ckpt", "last.ckpt"]
    for name in ("best-epoch00.ckpt", "last.ckpt"):
        assert torch.load(ckpts / name, weights_only=False)["global_step"] == 2  # epoch 0's, whole
