"""Two processes (DDP over gloo, on the CPU): logged once, and the epoch losses cover both processes' data."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, TINY
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gpt_lit.data import TimeMachineData

# The whole validation set (no limit), in windows that split evenly over two processes (no padding).
RUN = [
    "--config", str(REPO / "configs/residual.yaml"), *TINY, "--data.stride", "32", "--data.eval_train", "false",
    "--trainer.limit_train_batches", "3", "--trainer.max_epochs", "1",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


def gpt_lit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "gpt_lit", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_ddp_on_two_cpu_processes(tmp_path):
    data = TimeMachineData(context_length=32, stride=32)
    data.setup("fit")
    assert len(data.val_set) % 2 == 0  # else DistributedSampler would repeat a window to even the halves

    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    fit = gpt_lit("fit", *RUN, *ddp, cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "GLOBAL_RANK: 1" in fit.stderr and "distributed_backend=gloo" in fit.stderr

    runs = tmp_path / "lightning_logs" / "residual"
    assert [p.name for p in runs.iterdir()] == ["version_0"]  # one run folder, written by process 0 only
    logged = scalars(runs / "version_0")
    for tag in ("loss/train_step", "grad_norm/block_1", "grad_norm/block_2"):
        assert [s for s, _ in logged[tag]] == [0, 1, 2], tag  # each step once, not once per process
    assert [s for s, _ in logged["loss/val"]] == [2]
    assert [s for s, _ in logged["similarity/positions"]] == [0, 2]  # the start, then at loss/val's step

    # The epoch's validation loss is over the whole set, both processes' halves: one process evaluating
    # the same checkpoint on the whole set gets the same number.
    one = ["--trainer.strategy", "auto", "--trainer.devices", "1"]
    ckpt = runs / "version_0" / "checkpoints" / "last.ckpt"
    validate = gpt_lit(
        "validate", "--config", str(runs / "version_0" / "config.yaml"), *one, "--ckpt_path", str(ckpt), cwd=tmp_path
    )
    assert validate.returncode == 0, validate.stderr[-3000:]
    (_, single), (_, two) = scalars(runs / "version_1")["loss/val"][0], logged["loss/val"][0]
    assert abs(single - two) < 1e-5
