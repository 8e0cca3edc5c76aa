"""Turn an ordinary Lightning setting, pick the loggers, stop and resume: the answers stay right.

The matrix: settings {the shipped schedule; ``val_check_interval 0.5``; ``check_val_every_n_epoch 2`` with a sanity
check; ``max_steps`` ending mid-epoch; validation every 2 steps counted across epochs; ``accumulate_grad_batches 2``;
``limit_val_batches 0``} x loggers {TensorBoard; TensorBoard + CSV; CSV first, then TensorBoard; none} x stops {none;
SIGTERM during a step; Ctrl-C during a validation}. Every pair of a setting and a logger is a case (28), and the stops
go round so that every setting and every logger meets every stop (case (i, j): stop (i + j) mod 3);
``GPT_LIT_TESTS=full`` runs them all (as CI does), else the one of ``QUICK``.

Each case runs the tiny model (2 epochs of 3 or 4 batches, 2 validation batches) in this process: once without a
stop, and, with a stop, once stopped (a signal the process sends itself from a small callback) and resumed with the
command its last line prints. Checked:
- every tag logged at validations is logged at ``loss/val``'s steps, in every logger (``test_instruments_log_...``);
- the resumed run logs what the uninterrupted one logs: every tag of every logger (TensorBoard's scalars, images and
  text; the CSV's columns), the scalars to 1e-5;
- ``last.ckpt`` is the uninterrupted run's final state (its step, its weights to 1e-5);
- ``test`` on ``last.ckpt`` (``--ckpt_path last`` where the logger has a runs folder) gives the final ``loss/val``,
  where the last validation came after the last step.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import TINY, residual_without_throughput
from lightning.pytorch.callbacks import Callback
from test_fault_matrix import logged, one_thread

from gpt_lit.run.cli import main

RUN = [
    "--config", residual_without_throughput(), *TINY, "--data.eval_batch_size", "8",
    "--data.eval_train", "false", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4",
    "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
]  # fmt: skip

SETTINGS = {
    "shipped": [],
    "val_half_epoch": ["--trainer.val_check_interval", "0.5"],
    "every_2_epochs_sanity": ["--trainer.check_val_every_n_epoch", "2", "--trainer.num_sanity_val_steps", "1"],
    "max_steps_mid_epoch": ["--trainer.max_epochs", "-1", "--trainer.max_steps", "6"],  # epoch 1's second batch
    "every_2_steps_across": ["--trainer.check_val_every_n_epoch", "null", "--trainer.val_check_interval", "2",
                             "--trainer.limit_train_batches", "3"],  # after steps 1, 3 (epoch 1's first), 5
    "accumulate_2": ["--trainer.accumulate_grad_batches", "2"],
    "no_validation": ["--trainer.limit_val_batches", "0"],
}  # fmt: skip
LOGGERS = ["tensorboard", "tensorboard_csv", "csv_first", "none"]
STOPS = ["none", "sigterm_mid_step", "ctrl_c_validation"]
CASES = [(s, lg, STOPS[(i + j) % 3]) for i, s in enumerate(SETTINGS) for j, lg in enumerate(LOGGERS)]
# By default one case runs: Ctrl-C during a validation (a stop in an evaluation), without a logger, under
# accumulate_grad_batches 2. The stops at other moments are test_resume.py's. All 28 are in the ``full`` tier
# (GPT_LIT_TESTS=full, tests/conftest.py).
QUICK = {("accumulate_2", "none", "ctrl_c_validation")}
assert QUICK <= set(CASES)
CASES = [pytest.param(*case, id="-".join(case), marks=[] if case in QUICK else [pytest.mark.full]) for case in CASES]

# Tags logged once per validation, at that validation's loss/val step (the instruments of issue 29's rule 1).
PER_VALIDATION = ("loss/val", "loss/val_best", "loss_by_position/", "lens/", "stream/", "attention/entropy/",
                  "similarity/")  # fmt: skip


def logger_args(logger: str, folder: Path) -> list[str]:
    tensorboard = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                   "init_args": {"save_dir": str(folder), "name": "residual", "default_hp_metric": False}}
    csv_logger = {"class_path": "lightning.pytorch.loggers.CSVLogger",
                  "init_args": {"save_dir": str(folder), "name": "csv"}}  # fmt: skip
    # (a folder of its own: two loggers of one folder would each take a version_N there, 0 and 1)
    if logger == "tensorboard":
        return ["--trainer.logger.init_args.save_dir", str(folder)]
    if logger == "none":
        return ["--trainer.logger", "false", "--trainer.default_root_dir", str(folder)]
    both = [tensorboard, csv_logger] if logger == "tensorboard_csv" else [csv_logger, tensorboard]
    return ["--trainer.logger", json.dumps(both)]


# SIGTERM's step: 2 (epoch 0's third batch), or 3 where a validation follows it (epoch 1's first batch, the validation
# every 2 steps counted across epochs).
SIGTERM_STEP = {"every_2_steps_across": 3}


class Stop(Callback):
    """SIGTERM in the middle of training step ``step``; or Ctrl-C after the first batch of the first validation."""

    def __init__(self, stop: str, step: int = 2):
        self.stop, self.step, self.fired = stop, step, False

    def fire(self, signum: int) -> None:
        if not self.fired:
            self.fired = True
            os.kill(os.getpid(), signum)

    def on_before_backward(self, trainer, pl_module, loss):
        if self.stop == "sigterm_mid_step" and trainer.global_step == self.step:
            self.fire(signal.SIGTERM)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.stop == "ctrl_c_validation" and not trainer.sanity_checking and batch_idx == 0:
            self.fire(signal.SIGINT)


@dataclass
class Ran:
    """One case's runs: what each logger shows, the last.ckpt, and the checks' inputs."""

    reference: dict[str, dict] = field(default_factory=dict)  # logger kind -> tag -> [(step, value)]
    resumed: dict[str, dict] = field(default_factory=dict)
    reference_last: Path | None = None
    resumed_last: Path | None = None
    final_step: int = 0
    test_loss: float | None = None


def csv_logged(folder: Path) -> dict[str, list]:
    """metrics.csv as tag -> [(step, value)], in the order of its rows."""
    out: dict[str, list] = {}
    with open(folder / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            for tag, value in row.items():
                if tag not in ("step", "epoch") and value != "":
                    out.setdefault(tag, []).append((int(row["step"]), float(value)))
    return out


def what_loggers_show(logger: str, folder: Path) -> dict[str, dict]:
    shown = {}
    if logger in ("tensorboard", "tensorboard_csv", "csv_first"):
        events = logged(folder / "residual" / "version_0")
        shown["tensorboard"] = {f"{plugin}:{tag}": values for (plugin, tag), values in events.items()}
    if logger in ("tensorboard_csv", "csv_first"):
        shown["csv"] = csv_logged(folder / "csv" / "version_0")
    return shown


def last_ckpt(logger: str, folder: Path) -> Path:
    """Where Lightning puts the run's checkpoints: the first logger's run folder, default_root_dir without one."""
    run = {"none": ".", "csv_first": "csv/version_0"}.get(logger, "residual/version_0")
    return folder / run / "checkpoints" / "last.ckpt"


RAN: dict[tuple[str, str, str], Ran] = {}  # each case runs once, for both tests


def run_case(setting: str, logger: str, stop: str, folder: Path, capsys) -> Ran:
    if (setting, logger, stop) in RAN:
        return RAN[setting, logger, stop]
    args = [*RUN, *SETTINGS[setting]]
    ran = Ran()
    with one_thread():
        reference = folder / "reference"
        fit = main(["fit", *args, *logger_args(logger, reference)])
        ran.final_step = fit.trainer.global_step
        ran.reference = what_loggers_show(logger, reference)
        ran.reference_last = last_ckpt(logger, reference)
        stopped = folder / "stopped"
        if stop != "none":
            previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
            capsys.readouterr()
            try:
                stopper = Stop(stop, SIGTERM_STEP.get(setting, 2))
                main(["fit", *args, *logger_args(logger, stopped)], extra_callbacks=[stopper])
                code = 0
            except SystemExit as e:
                code = e.code
            finally:
                signal.signal(signal.SIGINT, previous)
            line = (capsys.readouterr().err.strip().splitlines() or [""])[-1]
            if code == 0:  # no validation to stop in
                assert setting == "no_validation" and stop == "ctrl_c_validation", line
            else:
                assert code == (143 if stop.startswith("sigterm") else 130) and "resume with: " in line, line
                command = shlex.split(line.split("resume with: ")[1])
                if "<same arguments>" in line:  # no logger, so no config.yaml in a run folder
                    command = ["python", "-m", "gpt_lit", "fit", *args, *logger_args(logger, stopped),
                               *command[command.index("--ckpt_path"):]]  # fmt: skip
                main(command[3:])
            ran.resumed = what_loggers_show(logger, stopped)
            ran.resumed_last = last_ckpt(logger, stopped)
        if "--trainer.limit_val_batches" not in SETTINGS[setting]:
            where = ["--ckpt_path", "last"] if logger != "none" else ["--ckpt_path", str(ran.reference_last)]
            test = main(["test", *args, *logger_args(logger, reference), *where, "--trainer.limit_test_batches", "2"])
            ran.test_loss = test.trainer.callback_metrics["test/loss"].item()
    RAN[setting, logger, stop] = ran
    return ran


@pytest.fixture
def folder(tmp_path_factory, request) -> Path:
    return tmp_path_factory.mktemp("settings")


@pytest.mark.parametrize(("setting", "logger", "stop"), CASES)
def test_resumed_equals_uninterrupted_and_last_is_the_final_state(setting, logger, stop, folder, capsys):
    ran = run_case(setting, logger, stop, folder, capsys)
    if ran.resumed:
        assert sorted(ran.resumed) == sorted(ran.reference)
        for kind, want in ran.reference.items():
            got = ran.resumed[kind]
            assert sorted(got) == sorted(want), kind
            for tag, values in want.items():
                if tag.startswith(("custom_scalars:", "hparams:")):  # written by every fit: the same set
                    assert {repr(v) for _, v in got[tag]} == {repr(v) for _, v in values}, (kind, tag)
                    continue
                assert [s for s, _ in got[tag]] == [s for s, _ in values], (kind, tag)  # each step once
                if kind == "csv" or tag.startswith("scalars:"):
                    assert [v for _, v in got[tag]] == pytest.approx([v for _, v in values], abs=1e-5), (kind, tag)
                else:
                    assert [v for _, v in got[tag]] == [v for _, v in values], (kind, tag)
    final = torch.load(ran.reference_last, map_location="cpu", weights_only=True)
    assert final["global_step"] == ran.final_step  # last.ckpt is the final state
    if ran.resumed_last is not None:
        resumed = torch.load(ran.resumed_last, map_location="cpu", weights_only=True)
        assert resumed["global_step"] == ran.final_step
        for name, tensor in final["state_dict"].items():
            torch.testing.assert_close(resumed["state_dict"][name], tensor, atol=1e-5, rtol=0, msg=name)
    if ran.test_loss is not None and ran.reference:
        shown = next(iter(ran.reference.values()))
        val = shown.get("scalars:loss/val") or shown.get("loss/val")
        if val[-1][0] == ran.final_step - 1:  # the last validation came after the last step
            assert ran.test_loss == pytest.approx(val[-1][1], abs=1e-5)


@pytest.mark.parametrize(("setting", "logger", "stop"), CASES)
def test_instruments_log_at_every_validation_at_loss_vals_step(setting, logger, stop, folder, capsys):
    ran = run_case(setting, logger, stop, folder, capsys)
    for kind, shown in ran.reference.items():
        tags = {tag.removeprefix("scalars:"): values for tag, values in shown.items() if ":" not in tag
                or tag.startswith("scalars:")}  # fmt: skip
        val_steps = [s for s, _ in tags.get("loss/val", [])]
        for tag, values in tags.items():
            if tag.startswith(PER_VALIDATION):
                # the instruments (not the losses) may also show the untrained model, before training, at step 0
                steps = [s for s, _ in values]
                if not tag.startswith("loss") and steps[:1] == [0] and val_steps[:1] != [0]:
                    steps = steps[1:]
                assert steps == val_steps, (kind, tag)
