"""Nothing lost: a run stopped and resumed logs the same losses as one that never stopped.

Each test runs `python -m gpt_lit fit` in subprocesses with a tiny model (2 epochs of 3 steps, dropout 0.1)
and compares what TensorBoard shows: the resumed run continues in the interrupted run's log folder.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gpt_lit.cli import main

RUN = [
    "--config", str(REPO / "configs/residual.yaml"), *TINY,
    "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
# Everything that depends on the weights, the data order and the dropout masks.
COMPARED = ["loss/train_step", "loss/val", "loss/train", "grad_norm/block_1", "grad_norm/block_2"]

SIGTERM_AT = '''
import os, signal
from lightning.pytorch.callbacks import Callback

class SigtermAt(Callback):
    """Send this process SIGTERM once training has reached `step`, as a cluster's scheduler would."""
    def __init__(self, step: int):
        self.step = step
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
'''


def gpt_lit(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", "gpt_lit", *args], cwd=cwd, env=env, capture_output=True, text=True, **kw
    )


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows for the run folder ``run`` (all its event files), as (step, value) lists."""
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def assert_same_losses(resumed: dict, uninterrupted: dict) -> None:
    for tag in COMPARED:
        steps = [s for s, _ in uninterrupted[tag]]
        assert [s for s, _ in resumed[tag]] == steps, tag  # every step once: nothing lost, nothing twice
        assert [v for _, v in resumed[tag]] == pytest.approx([v for _, v in uninterrupted[tag]], abs=1e-5), tag


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    cwd = tmp_path_factory.mktemp("uninterrupted")
    run = gpt_lit("fit", *RUN, "--trainer.max_epochs", "2", cwd=cwd, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    logged = scalars(cwd / "lightning_logs" / "residual" / "version_0")
    assert [s for s, _ in logged["loss/train_step"]] == [0, 1, 2, 3, 4, 5] and len(logged["loss/val"]) == 2
    return logged


def test_resume_from_the_end_of_an_epoch(tmp_path, uninterrupted):
    first = gpt_lit("fit", *RUN, "--trainer.max_epochs", "1", cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "lightning_logs" / "residual" / "version_0"
    more = ["--trainer.max_epochs", "2", "--trainer.logger.init_args.version", "0"]
    second = gpt_lit(
        "fit", *RUN, "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), *more, cwd=tmp_path, timeout=600
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert_same_losses(scalars(run), uninterrupted)


def test_sigterm_mid_epoch_saves_a_checkpoint_and_the_printed_command_resumes_exactly(tmp_path, uninterrupted):
    (tmp_path / "sigterm_at.py").write_text(SIGTERM_AT)
    stop = '--trainer.callbacks+={"class_path": "sigterm_at.SigtermAt", "init_args": {"step": 4}}'
    stopped = gpt_lit("fit", *RUN, "--trainer.max_epochs", "2", stop, cwd=tmp_path, timeout=600)
    assert stopped.returncode == 143 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    run = Path("lightning_logs") / "residual" / "version_0"
    ckpt = run / "checkpoints" / "interrupted.ckpt"
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"error: fit stopped by SIGTERM; resume with: python -m gpt_lit fit --config {run / 'config.yaml'} "
        f"--ckpt_path {ckpt} --trainer.logger.init_args.version 0"
    )
    state = torch.load(tmp_path / ckpt, map_location="cpu", weights_only=False)
    assert (state["epoch"], state["global_step"]) == (1, 4)  # in the middle of the second epoch
    logged = scalars(tmp_path / run)  # the TensorBoard log up to the signal
    assert [s for s, _ in logged["loss/train_step"]] == [0, 1, 2, 3]

    command = shlex.split(stopped.stderr.strip().splitlines()[-1].split("resume with: ")[1])
    assert command[:3] == ["python", "-m", "gpt_lit"]
    resumed = gpt_lit(*command[3:], cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "not resumable" not in resumed.stderr  # the data module resumes mid-epoch itself
    assert_same_losses(scalars(tmp_path / run), uninterrupted)


def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-m", "gpt_lit", "fit", *RUN, "--trainer.max_epochs", "1000"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "lightning_logs" / "residual" / "version_0"
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "last.ckpt").exists():  # training is under way once epoch 0 is saved
        assert proc.poll() is None and time.monotonic() < deadline, "fit did not get to its first checkpoint"
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    ckpt = run / "checkpoints" / "interrupted.ckpt"
    last_line = err.strip().splitlines()[-1]
    assert last_line.startswith("error: fit stopped by Ctrl-C; resume with: python -m gpt_lit fit --config ")
    assert f"--ckpt_path {ckpt.relative_to(tmp_path)} --trainer.logger.init_args.version 0" in last_line
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert state["global_step"] >= 3
    assert len(scalars(run)["loss/train_step"]) >= 3  # the log was flushed

    epochs = str(state["epoch"] + 1)
    resumed = gpt_lit("fit", *RUN, "--ckpt_path", str(ckpt), "--trainer.max_epochs", epochs, cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]


# -- Ctrl-C, data workers, checkpoints from any hook: each resumes exactly -------------------------------------

CTRL_C_AT = '''
import os, signal
from pathlib import Path
from lightning.pytorch.callbacks import Callback

class CtrlCAt(Callback):
    """Press Ctrl-C `times` times (SIGINT to this process): in the middle of training step `step`, between its
    forward and backward passes, or during the evaluation after epoch `epoch`. Once: the resumed run does not."""
    def __init__(self, step: int = -1, epoch: int = -1, times: int = 1):
        self.step, self.epoch, self.times = step, epoch, times
    def press(self):
        if not Path("pressed").exists():
            Path("pressed").touch()
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)
    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            self.press()
    def on_validation_batch_end(self, trainer, *args):
        if trainer.current_epoch == self.epoch and not trainer.sanity_checking:
            self.press()
'''


def default_sigint() -> None:
    """In the child: Ctrl-C's default action. A child of a non-interactive shell (CI) inherits SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def press_ctrl_c(tmp_path: Path, **where) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run 2 epochs, pressing Ctrl-C as ``CtrlCAt(**where)``; the run and its printed resume command."""
    (tmp_path / "ctrl_c_at.py").write_text(CTRL_C_AT)
    press = f'--trainer.callbacks+={{"class_path": "ctrl_c_at.CtrlCAt", "init_args": {json.dumps(where)}}}'
    run = gpt_lit("fit", *RUN, "--trainer.max_epochs", "2", press, cwd=tmp_path, timeout=600, preexec_fn=default_sigint)
    assert run.returncode == 130 and "Traceback" not in run.stderr, run.stderr[-3000:]
    last_line = run.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: fit stopped by Ctrl-C; resume with: python -m gpt_lit fit --config ")
    return run, shlex.split(last_line.split("resume with: ")[1])


def resume_here(command: list[str], tmp_path: Path, monkeypatch) -> None:
    """Run the printed resume command in this process (``main``, what the command runs), from the run's folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the config names ctrl_c_at.CtrlCAt
    assert command[:3] == ["python", "-m", "gpt_lit"]
    main(command[3:])


def test_ctrl_c_finishes_the_step_and_resumes_exactly(tmp_path, uninterrupted, monkeypatch):
    stopped, command = press_ctrl_c(tmp_path, step=4)
    assert stopped.stderr.count("finishing this step; Ctrl-C again to stop at once") == 1
    run = tmp_path / "lightning_logs" / "residual" / "version_0"
    state = torch.load(run / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=False)
    assert state["global_step"] == 5  # step 4, in which Ctrl-C came, was finished
    assert [s for s, _ in scalars(run)["loss/train_step"]] == [0, 1, 2, 3, 4]  # and logged

    resume_here(command, tmp_path, monkeypatch)
    assert_same_losses(scalars(run), uninterrupted)


def test_ctrl_c_during_the_evaluation_finishes_it_and_resumes_exactly(tmp_path, uninterrupted, monkeypatch):
    stopped, command = press_ctrl_c(tmp_path, epoch=0)
    run = tmp_path / "lightning_logs" / "residual" / "version_0"
    state = torch.load(run / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=False)
    assert state["global_step"] == 3
    assert [s for s, _ in scalars(run)["loss/val"]] == [2]  # epoch 0's whole-set losses were finished

    resume_here(command, tmp_path, monkeypatch)
    assert_same_losses(scalars(run), uninterrupted)


@pytest.fixture(scope="module")
def sigterm_with_workers(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """SIGTERM at step 4 of a run with a data-loading worker that also saves a checkpoint every 4 steps."""
    cwd = tmp_path_factory.mktemp("workers")
    (cwd / "sigterm_at.py").write_text(SIGTERM_AT)
    stop = '--trainer.callbacks+={"class_path": "sigterm_at.SigtermAt", "init_args": {"step": 4}}'
    every_4 = '--trainer.callbacks+={"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": %s}'
    every_4 %= json.dumps(
        {"every_n_train_steps": 4, "save_top_k": -1, "filename": "at-{step}", "auto_insert_metric_name": False}
    )
    args = ["fit", *RUN, "--data.num_workers", "1", "--trainer.max_epochs", "2", stop, every_4]
    stopped = gpt_lit(*args, cwd=cwd, timeout=600)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    return cwd, stopped


def test_resume_with_data_workers_sees_the_same_windows(sigterm_with_workers, uninterrupted):
    cwd, stopped = sigterm_with_workers
    command = shlex.split(stopped.stderr.strip().splitlines()[-1].split("resume with: ")[1])
    resumed = gpt_lit(*command[3:], cwd=cwd, timeout=600)  # with the run's config: data.num_workers 1
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_losses(scalars(cwd / "lightning_logs" / "residual" / "version_0"), uninterrupted)


def test_checkpoint_saved_after_a_step_resumes_at_the_next_batch(sigterm_with_workers, uninterrupted):
    cwd, _ = sigterm_with_workers
    ckpt = cwd / "lightning_logs" / "residual" / "version_0" / "checkpoints" / "at-4.ckpt"  # saved on_train_batch_end
    resumed = gpt_lit("fit", *RUN, "--trainer.max_epochs", "2", "--ckpt_path", str(ckpt), cwd=cwd, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged = scalars(cwd / "lightning_logs" / "residual" / "version_1")  # steps 4 and 5 only
    later = {tag: [(s, v) for s, v in uninterrupted[tag] if s >= 4] for tag in COMPARED}
    assert_same_losses(logged, later)
