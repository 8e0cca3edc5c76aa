"""Stop a run anywhere, resume it with the one command: TensorBoard and the final weights equal an uninterrupted run's.

The matrix: stops {Ctrl-C, Ctrl-C twice, SIGTERM, kill -9 during a save, a full disk} x moments {mid-step, during
validation, in the end-of-epoch hooks, during the sanity check, after the last epoch} x checkpoint configs
{the shipped ModelCheckpoint, none, ModelCheckpoint with mode max, a step interval that divides the epoch
(with save_last), AsyncCheckpointIO}. Every pair of values is in at least one case (a Latin square: 25 cases,
all in the ``full`` tier: ``GPT_LIT_TESTS=full``, as CI runs it).
Each case runs the tiny model (3 epochs of 2 steps, 3 validation batches, 1 sanity batch) in this process
(kill -9 in a forked child process), stops it, resumes it from ``last.ckpt`` as the stop's message says, and compares
every TensorBoard tag (scalars, images, text) and the final weights with ONE uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from gpt_lit.run.cli import main

pytestmark = pytest.mark.full  # the matrix's cases (docs/testing.md: two tiers)

RUN = [
    *TINY, "--data.eval_batch_size", "8", "--data.eval_train", "false", "--trainer.max_epochs", "3",
    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "3", "--trainer.num_sanity_val_steps", "1",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip

# The stops, fired by a callback at the chosen moment: signals to this process, as a terminal or a scheduler sends
# them; a kill -9 in the middle of writing a checkpoint (its fsync, after the bytes and before the rename); a file
# size limit of 10 MB from then on (the checkpoints are ~39 MB), which fails a write as a full disk does.
STOP = """
import os, resource, signal
from lightning.pytorch.callbacks import Callback

class Stop(Callback):
    def __init__(self, stop: str, moment: str):
        self.stop, self.moment, self.fired = stop, moment, False

    def fire(self):
        if self.fired:
            return
        self.fired = True
        if self.stop in ("ctrl_c", "ctrl_c_twice"):
            os.kill(os.getpid(), signal.SIGINT)
        if self.stop == "ctrl_c_twice":
            os.kill(os.getpid(), signal.SIGINT)
        if self.stop == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        if self.stop == "kill9":
            # Into the os module, in this forked child that dies at its next fsync (inside a save): no hook of
            # torch.save or the checkpoint writer runs between the write and the fsync (torch 2.13, Lightning 2.6.6).
            os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        if self.stop == "full_disk":
            resource.setrlimit(resource.RLIMIT_FSIZE, (10_000_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    def on_before_backward(self, trainer, pl_module, loss):
        if self.moment == "mid_step" and trainer.global_step == 2:  # epoch 1's first step
            self.fire()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.moment == "sanity_check" and trainer.sanity_checking:
            self.fire()
        in_epoch_0 = not trainer.sanity_checking and trainer.current_epoch == 0
        if self.moment == "validation" and in_epoch_0 and batch_idx == 1:
            self.fire()

    def on_train_epoch_end(self, trainer, pl_module):
        if self.moment == "epoch_end" and trainer.current_epoch == 0:
            self.fire()

    def on_train_end(self, trainer, pl_module):
        if self.moment == "after_last_epoch":
            self.fire()
"""

STOPS = ["ctrl_c", "ctrl_c_twice", "sigterm", "kill9", "full_disk"]
MOMENTS = ["mid_step", "validation", "epoch_end", "sanity_check", "after_last_epoch"]
CONFIGS = ["shipped", "none", "mode_max", "step_interval", "async"]
# Latin square: case (i, j) is stop i at moment j with config (i + j) mod 5, so every pair of values meets once.
CASES = [(s, m, CONFIGS[(i + j) % 5]) for i, s in enumerate(STOPS) for j, m in enumerate(MOMENTS)]
# last.ckpt's global step after one Ctrl-C or SIGTERM at each moment: after the step under way (epoch 1's first,
# step 2); after epoch 0's evaluation and end (2 steps); after the first step following the sanity check.
STOPPED_AT = {"mid_step": 3, "validation": 2, "epoch_end": 2, "sanity_check": 1}
EVERY_STEP = {"every_n_train_steps": 1, "save_top_k": 2, "monitor": "loss/train_step", "save_last": True,
              "filename": "step{step}"}  # fmt: skip


def config_args(config: str, folder: Path) -> list[str]:
    shipped = (REPO / "configs/residual.yaml").read_text()
    # Without the Throughput callback: its rates are wall-clock times, never the same in two runs.
    shipped = "".join(line for line in shipped.splitlines(True) if "gpt_lit.diagnostics.Throughput" not in line)
    text = {
        "shipped": shipped,
        "async": shipped,
        "mode_max": shipped.replace("mode: min", "mode: max"),
        "none": shipped[: shipped.index("    - class_path: lightning.pytorch.callbacks.ModelCheckpoint")],
        "step_interval": shipped[: shipped.index("    - class_path: lightning.pytorch.callbacks.ModelCheckpoint")],
    }[config]
    path = folder / f"{config}.yaml"
    path.write_text(text)
    args = ["--config", str(path), *RUN, "--trainer.logger.init_args.save_dir", str(folder / "logs")]
    if config == "async":
        args += ["--trainer.plugins", "lightning.pytorch.plugins.io.AsyncCheckpointIO"]
    if config == "step_interval":
        checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": EVERY_STEP}
        args += [f"--trainer.callbacks+={json.dumps(checkpoint)}"]
    return args


def logged(run: Path) -> dict[tuple[str, str], list]:
    """What TensorBoard shows for a run folder, as its data server reads it (events hidden by a restart left out):
    (plugin, tag) -> [(step, value)] for every tag: scalars, images, text, hparams, chart layouts."""
    events = EventAccumulator(str(run), size_guidance={"tensors": 0})
    events.Reload()
    out: dict[tuple[str, str], list] = {}
    for tag in events.Tags()["tensors"]:
        plugin = events.SummaryMetadata(tag).plugin_data.plugin_name
        out[plugin, tag] = [(e.step, tensor_util.make_ndarray(e.tensor_proto).tolist()) for e in events.Tensors(tag)]
    return out


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


def assert_same_run(run: Path, reference: Path) -> None:
    got, want = logged(run), logged(reference)
    assert sorted(got) == sorted(want)
    for key, values in want.items():
        if key[0] in ("custom_scalars", "hparams"):  # the run's settings and chart layout, written by every fit
            assert {repr(v) for _, v in got[key]} == {repr(v) for _, v in values}, key
            continue
        assert [s for s, _ in got[key]] == [s for s, _ in values], key  # every step once: none lost, none twice
        if key[0] == "scalars":
            assert [v for _, v in got[key]] == pytest.approx([v for _, v in values], abs=1e-5), key
        else:
            assert [v for _, v in got[key]] == [v for _, v in values], key
    final, expected = weights(run / "checkpoints/last.ckpt"), weights(reference / "checkpoints/last.ckpt")
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, atol=1e-5, rtol=0, msg=name)


@contextlib.contextmanager
def one_thread():
    """Torch on one thread, as on pytest-xdist's workers (tests/conftest.py) whatever the run: a kill -9 case forks,
    and a forked child computes on one thread only; its losses and figures must be the reference's to the bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """One uninterrupted run of the shipped config, for every case."""
    folder = tmp_path_factory.mktemp("reference")
    with one_thread():
        main(["fit", *config_args("shipped", folder)])
    run = folder / "logs" / "residual" / "version_0"
    assert [s for s, _ in logged(run)["scalars", "loss/train_step"]] == [0, 1, 2, 3, 4, 5]
    return run


@pytest.fixture
def stop_module(tmp_path, monkeypatch) -> Path:
    (tmp_path / "fault_stop.py").write_text(STOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fault_stop", None)
    return tmp_path


def run_stopped(stop: str, moment: str, args: list[str], folder: Path, capsys) -> tuple[int, str]:
    """Run ``fit`` with the stop; its exit status and its last line on stderr."""
    from fault_stop import Stop

    if stop == "kill9":  # the process dies: a child of this one, forked (a new Python would import torch anew)
        err = folder / "kill9.err"
        pid = os.fork()
        if pid == 0:  # the child: `fit`, its output into kill9.err; it never returns into pytest
            code = 1
            try:  # on one thread (one_thread()): the parent's OpenMP threads are not here, and with more ops hang
                fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = sys.stderr = open(fd, "w", buffering=1)  # not pytest's capture of the parent's output
                main(["fit", *args], extra_callbacks=[Stop(stop, moment)])
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        deadline = time.monotonic() + 300  # a child that hangs (a lock held by another thread at the fork) fails
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:  # the test instead of the whole suite
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the forked fit did not end within 300 s:\n{err.read_text()}")
            time.sleep(0.05)
        status = done[1]
        return os.waitstatus_to_exitcode(status), (err.read_text().strip().splitlines() or [""])[-1]

    previous_xfsz = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, as on a full disk
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        main(["fit", *args], extra_callbacks=[Stop(stop, moment)])
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous_xfsz)
    err = capsys.readouterr().err.strip().splitlines()
    return code, (err or [""])[-1]


@pytest.fixture(autouse=True)
def on_one_thread():
    with one_thread():
        yield


@pytest.mark.parametrize(("stop", "moment", "config"), CASES)
def test_stop_and_resume(stop, moment, config, reference, stop_module, capsys, monkeypatch):
    folder = stop_module
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        code, last_line = run_stopped(stop, moment, config_args(config, folder), folder, capsys)
    finally:
        signal.signal(signal.SIGINT, previous_sigint)
    run = folder / "logs" / "residual" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    if code == 0:  # the stop came when fit was over: nothing to resume
        assert moment == "after_last_epoch", last_line
    elif "resume with: " in last_line:
        if stop in ("ctrl_c", "sigterm"):  # saved where it stopped: the step, or the evaluation and the epoch's end
            assert torch.load(last, weights_only=False)["global_step"] == STOPPED_AT[moment]
        command = shlex.split(last_line.split("resume with: ")[1])
        assert command[:3] == ["python", "-m", "gpt_lit"] and f"--ckpt_path {last}" in last_line
        main(command[3:])
    else:
        assert stop in ("ctrl_c_twice", "kill9", "full_disk"), last_line
        if stop == "full_disk":
            assert last_line.startswith("error: no room to save checkpoint "), last_line
        if stop == "kill9":
            assert code == -signal.SIGKILL
        if not last.is_file():  # stopped before any save: start again, in a new run folder
            main(["fit", *config_args(config, folder), "--trainer.logger.init_args.version", "1"])
            run = run.with_name("version_1")
        else:  # the one resume command, with the run's config
            main(["fit", "--config", str(run / "config.yaml"), "--ckpt_path", str(last),
                  "--trainer.logger.init_args.version", "0"])  # fmt: skip
    assert_same_run(run, reference)
    assert not list(run.glob("checkpoints/*last-v*"))
    left = [p.name for p in run.glob("checkpoints/.*")]  # a kill -9 in the middle of a save leaves its part file
    assert not left or stop == "kill9" and all(name.endswith(".part") for name in left), left
