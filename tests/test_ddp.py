"""Two processes (DDP over gloo, on the CPU) give the answers one process gives.

The book cut as the shipped config cuts it (context 128: 316 training and 37 validation windows, so two
processes get 19 and 18 validation windows) and a tiny model. The two-process runs are `python -m gpt_lit`
subprocesses, as a user starts them; the one-process references run in this process (``main``).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gpt_lit.cli import main

RUN = [
    "--config", str(REPO / "configs/residual.yaml"),
    "--model.config.emb_dim", "32", "--model.config.n_layers", "2", "--model.config.n_heads", "2",
    "--data.batch_size", "4", "--trainer.limit_train_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
DDP = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
ONE = ["--trainer.strategy", "auto", "--trainer.devices", "1", "--trainer.accelerator", "cpu"]
PROMPTS = ["The Time Traveller", "I saw", "It was", "Weena"]
SAMPLING = ["--model.temperature", "1.0", "--model.top_k", "50", "--model.max_new_tokens", "6"]

POISON = '''
import math
from lightning.pytorch.callbacks import Callback

class PoisonOneProcess(Callback):
    """Before training step `step`, make process `rank`'s output head NaN, as a diverging process would."""
    def __init__(self, step: int, rank: int):
        self.step, self.rank = step, rank
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            pl_module.model.head.weight.data.fill_(math.nan)
'''


def gpt_lit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO)])}
    cmd = [sys.executable, "-m", "gpt_lit", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def ddp_fit(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """2 epochs of 2 steps on two processes; process 1's loss turns NaN at step 3 (epoch 1)."""
    cwd = tmp_path_factory.mktemp("ddp")
    (cwd / "poison.py").write_text(POISON)
    poison = '--trainer.callbacks+={"class_path": "poison.PoisonOneProcess", "init_args": {"step": 3, "rank": 1}}'
    fit = gpt_lit("fit", *RUN, *DDP, "--trainer.max_epochs", "2", poison, cwd=cwd)
    assert "GLOBAL_RANK: 1" in fit.stderr and "distributed_backend=gloo" in fit.stderr, fit.stderr[-3000:]
    return cwd, fit


@pytest.fixture()
def run(ddp_fit, monkeypatch) -> Path:
    """The two-process run's folder; its config.yaml names poison.py, which is importable from here too."""
    cwd, _ = ddp_fit
    monkeypatch.syspath_prepend(str(cwd))
    return cwd / "lightning_logs" / "residual" / "version_0"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the in-process runs' lightning_logs/ go here


def test_a_nan_on_one_process_stops_both_with_one_line(ddp_fit):
    cwd, fit = ddp_fit
    assert fit.returncode == 2 and "Traceback" not in fit.stderr, fit.stderr[-3000:]
    errors = [line for line in fit.stderr.splitlines() if line.startswith("error:")]
    last = Path("lightning_logs") / "residual" / "version_0" / "checkpoints" / "last.ckpt"
    assert errors == [
        f"error: the training loss is nan at step 3 (epoch 1, batch 1, process 1 of 2); training stopped before "
        f"that update and the last good checkpoint is {last}. Try a smaller model.lr"
    ]
    # Data only, as every checkpoint is loaded: nothing beyond what weights_only reads without being told.
    assert torch.serialization.get_unsafe_globals_in_checkpoint(cwd / last) == []
    ckpt = torch.load(cwd / last, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 2  # after epoch 0
    assert len(ckpt["callbacks"]["RNGState"]["ranks"]) == 2  # each process's generators, for its dropout masks


def test_logged_once_and_the_whole_sets_equal_one_process(run):
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]  # one run folder, written by process 0 only
    logged = scalars(run)
    for tag in ("loss/train_step", "grad_norm/block_1", "grad_norm/block_2"):
        assert [s for s, _ in logged[tag]] == [0, 1, 2], tag  # each step once, not once per process
    assert [s for s, _ in logged["loss/val"]] == [1]  # epoch 0's end, at its last step, as self.log puts it
    assert [s for s, _ in logged["similarity/positions"]] == [0, 1]  # the start, then at loss/val's step

    # Epoch 0's loss/val (37 windows) and loss/train (316) under two processes, against one process
    # evaluating the checkpoint taken right after them.
    ckpt = run / "checkpoints" / "last.ckpt"
    one = main(["validate", "--config", str(run / "config.yaml"), *ONE, "--ckpt_path", str(ckpt)])
    for tag in ("loss/val", "loss/train"):
        [(_, two)] = logged[tag]
        assert two == pytest.approx(one.trainer.callback_metrics[tag].item(), abs=1e-5), tag


def test_test_on_two_processes_equals_one_and_the_runs_validation(ddp_fit, run):
    cwd, _ = ddp_fit
    args = ["test", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    two = gpt_lit(*args, *DDP, cwd=cwd)
    assert two.returncode == 0, two.stderr[-3000:]
    [(_, two_loss)] = scalars(run / "test" / "last")["test/loss"]  # test lands beside the run it evaluates
    one = main([*args, *ONE]).trainer.callback_metrics["test/loss"].item()
    [(_, val_loss)] = scalars(run)["loss/val"]  # the test set is the validation set
    assert two_loss == pytest.approx(one, abs=1e-5) and one == pytest.approx(val_loss, abs=1e-5)


def test_predict_on_two_processes_writes_every_prompt_once_in_order(ddp_fit, run):
    cwd, _ = ddp_fit
    args = ["predict", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    args += ["--data.prompts", json.dumps(PROMPTS), *SAMPLING]
    two = gpt_lit(*args, *DDP, cwd=cwd)
    assert two.returncode == 0, two.stderr[-3000:]
    written = run / "predict" / "last" / "continuations.txt"  # beside the run it continues from
    two_text = written.read_text()
    texts = two_text.strip().split("\n\n")
    assert len(texts) == 4 and all(map(str.startswith, texts, PROMPTS))  # all four, in the prompts' order
    assert two.stdout.count("continuation(s) written to") == 1
    assert f"[4 continuation(s) written to {written}]" in two.stdout
    assert all(two.stdout.count(t) == 1 for t in texts)  # printed once

    # Sampled (temperature 1, top 50), yet the same text from one process: each prompt has its own generator.
    main([*args, *ONE])
    assert written.read_text() == two_text  # one process wrote the same file again


def test_fsdp_on_cpu_is_refused_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *RUN, "--trainer.strategy", "fsdp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "fsdp" in line.lower() and "gpu" in line.lower(), line
