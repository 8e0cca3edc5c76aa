"""What `fit` leaves in checkpoints/: last.ckpt the latest epoch, sharing the best's bytes; a full disk loses nothing.

The runs use the tiny model; the exact-resume tests in test_resume.py resume from the same (linked) last.ckpt.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY

from gpt_lit.checkpointing import AtomicCheckpointIO
from gpt_lit.cli import main

RUN = [
    *TINY, "--data.eval_train", "false",
    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


def fit(config: str | Path, save_dir: Path, *args: str) -> Path:
    """Train in this process (as `python -m gpt_lit fit` does); return the run's checkpoints folder."""
    main(["fit", "--config", str(config), *RUN, "--trainer.logger.init_args.save_dir", str(save_dir), *args])
    return save_dir / "residual" / "version_0" / "checkpoints"  # every config here is residual.yaml's, edited


def step_and_epoch(path: Path) -> tuple[int, int]:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return ckpt["global_step"], ckpt["epoch"]


def test_last_is_the_final_epoch_when_the_best_is_earlier(tmp_path):
    # Keep the epoch with the *highest* validation loss as "best": the first one, as the loss falls.
    config = tmp_path / "residual_worst.yaml"
    config.write_text((REPO / "configs/residual.yaml").read_text().replace("mode: min", "mode: max"))
    ckpts = fit(config, tmp_path, "--trainer.max_epochs", "3")
    assert sorted(p.name for p in ckpts.iterdir()) == ["best-epoch00.ckpt", "last.ckpt"]
    assert step_and_epoch(ckpts / "best-epoch00.ckpt") == (2, 0)
    assert step_and_epoch(ckpts / "last.ckpt") == (6, 2)  # all 3 x 2 steps: the final weights
    assert not os.path.samefile(ckpts / "last.ckpt", ckpts / "best-epoch00.ckpt")


def test_last_and_best_of_the_same_epoch_are_one_file(tmp_path):
    ckpts = fit(REPO / "configs/residual.yaml", tmp_path, "--trainer.max_epochs", "2")
    last, best = ckpts / "last.ckpt", ckpts / "best-epoch01.ckpt"
    assert sorted(p.name for p in ckpts.iterdir()) == [best.name, last.name]  # no temporary file left
    assert os.path.samefile(last, best) and last.stat().st_nlink == 2  # a hard link
    on_disk = sum(p.stat().st_blocks * 512 for p in {p.stat().st_ino: p for p in ckpts.iterdir()}.values())
    assert on_disk < 1.01 * last.stat().st_size + 65536  # one file's bytes, not two
    assert step_and_epoch(last) == (4, 1)


def test_a_config_without_a_model_checkpoint_still_saves_last(tmp_path):
    text = (REPO / "configs/residual.yaml").read_text()
    config = tmp_path / "mine.yaml"
    config.write_text(text[: text.index("    - class_path: gpt_lit.checkpointing.EpochCheckpoint")])
    assert "ModelCheckpoint" not in config.read_text() and "EpochCheckpoint" not in config.read_text()
    ckpts = fit(config, tmp_path, "--trainer.max_epochs", "2")
    assert [p.name for p in ckpts.iterdir()] == ["last.ckpt"]
    assert step_and_epoch(ckpts / "last.ckpt") == (4, 1)


def test_checkpointing_can_be_turned_off(tmp_path):
    off = ["--trainer.max_epochs", "1", "--trainer.enable_checkpointing", "false"]
    run = fit(REPO / "configs/residual.yaml", tmp_path, *off)
    assert not run.exists() and any(run.parent.glob("events.out.tfevents.*"))


def test_atomic_checkpoint_io_keeps_the_old_file_when_a_save_fails(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(1000)}, path)
    assert io.bytes_written == path.stat().st_size

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        io.save_checkpoint({"step": 2, "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=False)["step"] == 1  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


# A run whose files may be at most LIMIT bytes (the tiny model's checkpoints are ~39 MB): like a full disk,
# writing past it fails with "File too large" (SIGXFSZ ignored, so the write returns the error instead).
FSIZE_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000_000, 20_000_000))
from gpt_lit.cli import main
main(sys.argv[1:])
"""


def test_a_save_that_runs_out_of_room_keeps_the_last_good_checkpoint(tmp_path):
    ckpts = fit(REPO / "configs/residual.yaml", tmp_path, "--trainer.max_epochs", "1")
    last = ckpts / "last.ckpt"
    before = last.read_bytes()

    resume = ["fit", "--config", str(REPO / "configs/residual.yaml"), *RUN, "--trainer.max_epochs", "2",
              "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.logger.init_args.version", "0",
              "--ckpt_path", str(last)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", FSIZE_LIMITED, *resume], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and out.stderr.strip().splitlines()[-1] == errors[0]
    size = len(before)  # the new checkpoint is the same size as the old one
    assert errors[0].startswith(f"error: no room to save checkpoint best-epoch01.ckpt in {ckpts} (File too large)")
    needed = int(errors[0].split("it needs ")[1].split(" bytes")[0].replace(",", ""))
    assert abs(needed - size) < 0.01 * size
    assert f"the last good checkpoint is {last}" in errors[0]

    assert sorted(p.name for p in ckpts.iterdir()) == ["best-epoch00.ckpt", "last.ckpt"]  # nothing half-written
    assert last.read_bytes() == before
    fit(REPO / "configs/residual.yaml", tmp_path, "--trainer.max_epochs", "2",
        "--trainer.logger.init_args.version", "0", "--ckpt_path", str(last))  # fmt: skip
    assert step_and_epoch(last) == (4, 1)  # resumed from it and finished
