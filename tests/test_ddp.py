"""Two processes (DDP over gloo, on the CPU) give the answers one process gives.

The book cut as the shipped config cuts it, a window every 128 tokens, and a tiny model with windows of 32 tokens:
317 training and 37 validation windows, so two processes get 19 and 18 validation windows. ONE pair of
processes (``ddp``, once per module) runs the steps of ``STEPS`` one after another, each as `python -m gpt_lit
<step>` would (``gpt_lit.run.cli.main``): `predict` with one prompt for the two processes (refused before process 1
is started, as a reader's command is), `fit` (process 1's loss turns NaN in epoch 1), then `test`, `validate` and
`predict` on the checkpoint it left, SIGTERM to either process, tests/test_resume_windows.py's run resumed mid-epoch
(a one-process run made here first: refused), the run SIGTERM stopped resumed, and a full disk. Lightning starts
process 1 itself, by running the same script again, as it does for `python -m gpt_lit`. Each step's stdout, stderr
and exit status, per process, are kept; the tests read them and the run folder. To check something more on two
processes, add a step to ``STEPS`` and a test that reads ``ddp.step(name)``. The one-process references run in this
process (``main``).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import REPO, residual_without_throughput, run_session, scalars
from test_bad_inputs import everything
from test_resume_windows import Uninterrupted, epoch_order, uninterrupted_run

from gpt_lit.run.cli import main

pytestmark = pytest.mark.full  # processes of their own (docs/testing.md: two tiers)

RUN = [
    "--config", residual_without_throughput(),
    "--model.config.emb_dim", "32", "--model.config.n_layers", "2", "--model.config.n_heads", "2",
    "--data.context_length", "32", "--data.stride", "128", "--data.batch_size", "4",
    "--trainer.limit_train_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
DDP = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
ONE = ["--trainer.strategy", "auto", "--trainer.devices", "1", "--trainer.accelerator", "cpu"]
PROMPTS = ["The Time Traveller", "I saw", "It was", "Weena"]
SAMPLING = ["--model.temperature", "1.0", "--model.top_k", "50", "--model.max_new_tokens", "6"]

POISON = '''
import math, os, resource, signal
from lightning.pytorch.callbacks import Callback

class PoisonOneProcess(Callback):
    """Before training step `step`, make process `rank`'s output head NaN, as a diverging process would."""
    def __init__(self, step: int, rank: int):
        self.step, self.rank = step, rank
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            pl_module.model.head.weight.data.fill_(math.nan)

class FillTheDisk(Callback):
    """After training step `step`, let process `rank` write no file over 10 MB (a checkpoint is ~39 MB): its next
    save fails as on a full disk."""
    def __init__(self, step: int, rank: int):
        self.step, self.rank = step, rank
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (10_000_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

class SigtermAt(Callback):
    \"\"\"In the middle of training step `step`, send process `rank` SIGTERM, as a scheduler does.\"\"\"
    def __init__(self, step: int, rank: int):
        self.step, self.rank = step, rank
    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGTERM)
'''


# Runs the steps on this process and, once Lightning has started it, on process 1 (which runs this script again).
SESSION = """
import gc, json, os, sys
from pathlib import Path
from gpt_lit.run.cli import main
gc.freeze()  # as gpt_lit/__main__.py does after its imports

def step_output(name):
    '''This process's stdout and stderr from here on (print()s and logging alike) into <name>.<rank>.out/.err.'''
    rank = os.environ.get("LOCAL_RANK", "0")  # process 1 is started with it; process 0 sets it when it starts 1
    sys.stdout.flush(); sys.stderr.flush()
    for fd, kind in ((1, "out"), (2, "err")):
        f = os.open(f"{name}.{rank}.{kind}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    return rank

codes = {}
for name, args in json.loads(Path("steps.json").read_text()):
    rank = step_output(name)
    try:
        main(args)
        codes[name] = 0
    except SystemExit as e:
        codes[name] = e.code
    sys.stdout.flush(); sys.stderr.flush()
    Path(f"codes.{rank}.json").write_text(json.dumps(codes))

import torch.distributed
if torch.distributed.is_initialized():
    torch.distributed.barrier()  # process 0 ends after process 1 has written everything
"""

LAST = ["--config", "lightning_logs/residual/version_0/config.yaml",
        "--ckpt_path", "lightning_logs/residual/version_0/checkpoints/last.ckpt"]  # fmt: skip
POISON_AT_STEP_3 = '--trainer.callbacks+={"class_path": "poison.PoisonOneProcess", "init_args": {"step": 3, "rank": 1}}'
SHIPPED_BEST = json.dumps({"class_path": "ModelCheckpoint", "init_args": {
    "monitor": "loss/val", "filename": "best-epoch{epoch:02d}",
    "auto_insert_metric_name": False}})  # fmt: skip


def sigterm(rank: int) -> tuple[str, list[str]]:
    """A step: one epoch of 2 steps, and process ``rank`` gets SIGTERM in the first."""
    stop = json.dumps({"class_path": "poison.SigtermAt", "init_args": {"step": 0, "rank": rank}})
    return (f"sigterm_{rank}", ["fit", *RUN, *DDP, "--trainer.max_epochs", "1", "--data.eval_train", "false",
                                "--trainer.limit_val_batches", "1", "--trainer.callbacks", "[]",
                                "--trainer.logger.init_args.name", f"sigterm_{rank}", f"--trainer.callbacks+={stop}"])


DISK_FULL_AT_STEP_3 = '--trainer.callbacks+={"class_path": "poison.FillTheDisk", "init_args": {"step": 3, "rank": 0}}'
ONE_PROMPT = ["predict", *RUN, *DDP, "--data.prompts", '["The Time Traveller"]', "--trainer.logger.init_args.save_dir",
              "one_prompt", "--ckpt_path", "one_prompt/model.ckpt"]  # fmt: skip
STEPS = [
    ("one_prompt", ONE_PROMPT),  # first: process 1 is not started yet
    ("fit", ["fit", *RUN, *DDP, "--trainer.max_epochs", "2", POISON_AT_STEP_3]),  # 2 epochs of 2 steps
    ("test", ["test", *LAST, *DDP]),
    ("validate", ["validate", *LAST, *DDP, "--trainer.logger.init_args.name", "validate"]),
    ("predict", ["predict", *LAST, "--data.prompts", json.dumps(PROMPTS), *SAMPLING, *DDP]),
    sigterm(1),
    sigterm(0),
]  # fmt: skip
# Process 0's disk fills in epoch 1: its saves at that epoch's end fail, the new best's first (the limit stays: the
# last step, after STEPS and the resumes of ``resume_steps``).
FULL_DISK = (
    "full_disk", ["fit", *RUN, *DDP, "--trainer.max_epochs", "2", "--data.eval_train", "false",
                   "--trainer.limit_val_batches", "1", "--trainer.callbacks", "[]",  # the best file's and last.ckpt's
                   f"--trainer.callbacks+={SHIPPED_BEST}", "--trainer.logger.init_args.name", "full_disk",
                   DISK_FULL_AT_STEP_3],
)  # fmt: skip


def resume_steps(run: Uninterrupted) -> list[tuple[str, list[str]]]:
    """tests/test_resume_windows.py's one-process run resumed from its step-3 checkpoint on two processes (refused),
    a batch size no process can fill, and the run ``sigterm(0)`` stopped resumed with its printed command (a new
    version folder, so that sigterm_0's stays as it stopped); ``RecordWindows`` writes each process's windows into
    the step's folder."""

    def record(folder: str) -> str:
        spec = {"class_path": "test_resume_windows.RecordWindows", "init_args": {"folder": folder}}
        return f"--trainer.callbacks+={json.dumps(spec)}"

    stopped = Path("lightning_logs") / "sigterm_0" / "version_0"
    return [
        ("resumed", ["fit", *run.args, *DDP, "--trainer.max_epochs", "1", "--ckpt_path", str(run.step3),
                     record("resumed")]),
        ("too_big", ["fit", *run.args, *DDP, "--data.batch_size", "30", record("too_big")]),  # 44 windows: 22 each
        ("resumed_sigterm", ["fit", "--config", str(stopped / "config.yaml"),
                             "--ckpt_path", str(stopped / "checkpoints" / "last.ckpt"), record("resumed_sigterm")]),
    ]  # fmt: skip


@dataclass
class TwoProcesses:
    cwd: Path  # where the steps ran: lightning_logs/ is here
    uninterrupted: Uninterrupted  # the one-process run that the step "resumed" resumes
    one_prompt: dict  # the folder the step "one_prompt" predicts into, before the steps ran (everything())

    def step(self, name: str) -> tuple[list[int], str, str]:
        """A step's exit status on each process, and their stdout and stderr (process 0's, then process 1's)."""
        codes = [json.loads((self.cwd / f"codes.{rank}.json").read_text())[name] for rank in (0, 1)]
        out, err = (
            "".join((self.cwd / f"{name}.{rank}.{kind}").read_text() for rank in (0, 1)) for kind in ("out", "err")
        )
        return codes, out, err


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> TwoProcesses:
    """STEPS, run once on one pair of processes (a subprocess, which Lightning makes two)."""
    cwd = tmp_path_factory.mktemp("ddp")
    uninterrupted = uninterrupted_run(tmp_path_factory.mktemp("resume_windows"))
    resumes = resume_steps(uninterrupted)
    for name, _ in resumes:
        (cwd / name).mkdir()
    (cwd / "poison.py").write_text(POISON)
    (cwd / "session.py").write_text(SESSION)
    (cwd / "steps.json").write_text(json.dumps([*STEPS, *resumes, FULL_DISK]))
    (cwd / "one_prompt").mkdir()
    shutil.copy(uninterrupted.step3, cwd / "one_prompt" / "model.ckpt")
    one_prompt = everything(cwd / "one_prompt")
    run_session(cwd, [cwd, Path(__file__).parent, REPO], timeout=400)
    ran = TwoProcesses(cwd, uninterrupted, one_prompt)
    _, _, err = ran.step("fit")
    assert "GLOBAL_RANK: 1" in err and "distributed_backend=gloo" in err, err[-3000:]
    return ran


@pytest.fixture()
def run(ddp, monkeypatch) -> Path:
    """The two-process run's folder; its config.yaml names poison.py, which is importable from here too."""
    monkeypatch.syspath_prepend(str(ddp.cwd))
    return ddp.cwd / "lightning_logs" / "residual" / "version_0"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the in-process runs' lightning_logs/ go here


def test_a_nan_on_one_process_stops_both_with_one_line(ddp):
    codes, _, err = ddp.step("fit")
    assert codes == [2, 2] and "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    last = Path("lightning_logs") / "residual" / "version_0" / "checkpoints" / "last.ckpt"
    assert errors == [
        f"error: the training loss is nan at step 3 (epoch 1, batch 1, process 1 of 2); training stopped before "
        f"that update and the last good checkpoint is {last}. Try a smaller model.lr"
    ]
    # Data only, as every checkpoint is loaded: nothing beyond what weights_only reads without being told.
    assert torch.serialization.get_unsafe_globals_in_checkpoint(ddp.cwd / last) == []
    ckpt = torch.load(ddp.cwd / last, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 2  # after epoch 0
    assert len(ckpt["callbacks"]["RNGState"]["ranks"]) == 2  # each process's generators, for its dropout masks


def test_fewer_prompts_than_processes_write_nothing(ddp):
    codes, _, err = ddp.step("one_prompt")
    assert codes == [2, 2], err[-3000:]  # process 0's as a reader types it; process 1's when Lightning starts it
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: 1 prompt(s) for 2 processes: predict continues each prompt on one process, so give at least 2 "
        "prompts, or run predict on one process (--trainer.devices 1)"
    ]
    assert "Traceback" not in err and "Restoring states" not in err
    assert everything(ddp.cwd / "one_prompt") == ddp.one_prompt  # the folder it would predict into, as it was


def test_a_full_disk_on_process_0_stops_both_with_one_line_and_keeps_the_last_checkpoint(ddp):
    # Only process 0 writes; process 1 waits for it in the save's barrier, and stops with it, with the same error.
    codes, _, err = ddp.step("full_disk")
    assert codes == [2, 2] and "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    folder = Path("lightning_logs") / "full_disk" / "version_0" / "checkpoints"
    assert len(errors) == 1 and errors[0].startswith("error: no room to save checkpoint best-epoch01.ckpt "), errors
    assert f"the last good checkpoint is {folder / 'last.ckpt'}" in errors[0], errors[0]
    ckpt = torch.load(ddp.cwd / folder / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 2  # epoch 0's, whole
    # The best epoch so far keeps its file: the new best's save failed, so nothing took its place.
    assert sorted(p.name for p in (ddp.cwd / folder).iterdir()) == ["best-epoch00.ckpt", "last.ckpt"]
    [best] = [s for k, s in ckpt["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert Path(best["best_model_path"]).name == "best-epoch00.ckpt"
    assert torch.load(ddp.cwd / folder / "best-epoch00.ckpt", weights_only=True)["global_step"] == 2
    assert not list((ddp.cwd / folder).glob(".*.part"))  # the failed write left nothing behind


@pytest.mark.parametrize("rank", [1, 0])
def test_sigterm_to_either_process_stops_both_with_one_line_and_the_resume_command(ddp, rank):
    codes, _, err = ddp.step(f"sigterm_{rank}")
    assert codes == [143, 143] and "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    run = Path("lightning_logs") / f"sigterm_{rank}" / "version_0"
    assert errors == [
        f"error: fit stopped by SIGTERM; resume with: python -m gpt_lit fit --config {run / 'config.yaml'} "
        f"--ckpt_path {run / 'checkpoints' / 'last.ckpt'} --trainer.logger.init_args.version 0"
    ]
    ckpt = torch.load(ddp.cwd / run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 1  # after the step under way


def test_logged_once_and_the_whole_sets_equal_one_process(run):
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]  # one run folder, written by process 0 only
    logged = scalars(run)
    for tag in ("loss/train_step", "grad_norm/block_1", "grad_norm/block_2"):
        assert [s for s, _ in logged[tag]] == [0, 1, 2], tag  # each step once, not once per process
    assert [s for s, _ in logged["loss/val"]] == [1]  # epoch 0's end, at its last step, as self.log puts it
    assert [s for s, _ in logged["similarity/positions"]] == [0, 1]  # the start, then at loss/val's step

    # Epoch 0's loss/val (37 windows) and loss/train (317) under two processes, against one process
    # evaluating the checkpoint taken right after them.
    ckpt = run / "checkpoints" / "last.ckpt"
    one = main(["validate", "--config", str(run / "config.yaml"), *ONE, "--ckpt_path", str(ckpt)])
    for tag in ("loss/val", "loss/train"):
        [(_, two)] = logged[tag]
        assert two == pytest.approx(one.trainer.callback_metrics[tag].item(), abs=1e-5), tag


def test_test_on_two_processes_equals_one_and_the_runs_validation(ddp, run):
    codes, _, err = ddp.step("test")
    assert codes == [0, 0], err[-3000:]
    [(_, two_loss)] = scalars(run / "test" / "last")["test/loss"]  # test lands beside the run it evaluates
    args = ["test", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    one = main([*args, *ONE]).trainer.callback_metrics["test/loss"].item()
    [(_, val_loss)] = scalars(run)["loss/val"]  # the test set is the validation set
    assert two_loss == pytest.approx(one, abs=1e-5) and one == pytest.approx(val_loss, abs=1e-5)


@pytest.mark.parametrize("step", ["fit", "validate", "test"])
def test_no_sync_dist_advice_for_values_the_metrics_reduced(ddp, step):
    # Lightning's advice for epoch values it would not reduce itself: the metrics reduce them across processes.
    # Lightning gives each advice once per process, so "fit", the session's first step, is where it would show.
    codes, _, err = ddp.step(step)
    assert step == "fit" or codes == [0, 0], err[-3000:]
    assert "sync_dist" not in err, err[-3000:]


def test_predict_on_two_processes_writes_every_prompt_once_in_order(ddp, run):
    codes, out, err = ddp.step("predict")
    assert codes == [0, 0], err[-3000:]
    written = run / "predict" / "last" / "continuations.txt"  # beside the run it continues from
    two_text = written.read_text()
    texts = two_text.strip().split("\n\n")
    assert len(texts) == 4 and all(map(str.startswith, texts, PROMPTS))  # all four, in the prompts' order
    assert out.count("continuation(s) written to") == 1
    assert f"[4 continuation(s) written to {written.relative_to(ddp.cwd)}]" in out
    assert all(out.count(t) == 1 for t in texts)  # printed once

    # Sampled (temperature 1, top 50), yet the same text from one process: each prompt has its own generator.
    args = ["predict", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    main([*args, "--data.prompts", json.dumps(PROMPTS), *SAMPLING, *ONE])
    assert written.read_text() == two_text  # one process wrote the same file again


def test_a_mid_epoch_resume_on_another_number_of_processes_is_refused_with_one_line(ddp):
    codes, _, err = ddp.step("resumed")
    assert codes == [2, 2] and "Traceback" not in err, err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("error:")]  # process 0's
    assert line == (
        f"error: {ddp.uninterrupted.step3} was saved mid-epoch (epoch 0, after 12 of its 44 training windows) with "
        f"processes 1 (now 2): the rest of that epoch is not this run's batches. Resume with the checkpoint's "
        f"settings until the epoch ends, then change them, or resume from a checkpoint saved at the end of an epoch"
    )
    assert not list((ddp.cwd / "resumed").iterdir())  # nothing trained
    assert "ddp" not in (ddp.uninterrupted.step3.parents[1] / "logs" / "config.yaml").read_text()  # nor written


def test_a_resume_on_two_processes_continues_from_the_same_window(ddp):
    # sigterm(0)'s run stopped after its epoch's first step (of 2 x 4 windows of 317): resumed, each process trains
    # on its share of the epoch's second step, every other window of the global order's windows 8 to 15.
    codes, _, err = ddp.step("resumed_sigterm")
    assert codes == [0, 0], err[-3000:]
    order = epoch_order(317, 123, 0)
    for rank in (0, 1):
        run = json.loads((ddp.cwd / "resumed_sigterm" / f"windows.{rank}.json").read_text())
        assert run["batches"] == [[0, 1, order[8 + rank : 16 : 2]]]
        assert run["validated"] == [0]


def test_a_batch_no_process_can_fill_is_one_line(ddp):
    codes, _, err = ddp.step("too_big")
    assert codes == [2, 2] and "Traceback" not in err, err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line == (
        "error: 44 training windows give each of the 2 processes 22, no full batch of data.batch_size=30 (a batch "
        "size per process): use data.batch_size 22 or less, or fewer processes"
    )


# -- docs/several_processes.md's two-machine command, as two nodes on this machine ---------------------------------

NODE = """
import json, os, sys
from pathlib import Path
from gpt_lit.run.cli import main

rank = os.environ["NODE_RANK"]
for fd, kind in ((1, "out"), (2, "err")):
    f = os.open(f"node.{rank}.{kind}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(f, fd)
    os.close(f)
try:
    main(json.loads(Path("node_args.json").read_text()))
    code = 0
except SystemExit as e:
    code = e.code
sys.stdout.flush(); sys.stderr.flush()
Path(f"node_code.{rank}").write_text(str(code))
import torch.distributed
if torch.distributed.is_initialized():
    torch.distributed.barrier()  # node 0 ends after node 1 has written everything
"""
# One epoch of 2 steps without dropout (each process draws its own masks), 4 windows a step on each node: the
# same 8 windows a step as one process with batches of 8, and the same averaged gradient.
NODES_RUN = [*RUN, "--model.config.dropout", "0", "--trainer.max_epochs", "1", "--data.eval_train", "false"]


def test_two_nodes_of_one_process_each_give_one_processs_losses_instruments_and_checkpoint(tmp_path_factory):
    import socket

    cwd = tmp_path_factory.mktemp("nodes")
    (cwd / "node.py").write_text(NODE)
    nodes = ["--trainer.strategy", "ddp", "--trainer.num_nodes", "2", "--trainer.devices", "1",
             "--trainer.accelerator", "cpu"]  # fmt: skip
    (cwd / "node_args.json").write_text(json.dumps(["fit", *NODES_RUN, *nodes]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "GLOBAL_RANK")}
    env.update(PYTHONPATH=os.pathsep.join([str(cwd), str(REPO)]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [subprocess.Popen([sys.executable, "node.py"], cwd=cwd, env={**env, "NODE_RANK": str(rank)},
                              start_new_session=True) for rank in (0, 1)]  # fmt: skip
    try:
        for proc in procs:
            proc.wait(timeout=300)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    err = "".join((cwd / f"node.{rank}.err").read_text() for rank in (0, 1))
    assert [(cwd / f"node_code.{rank}").read_text() for rank in (0, 1)] == ["0", "0"], err[-3000:]
    assert "GLOBAL_RANK: 1" in err and "distributed_backend=gloo" in err and "Traceback" not in err, err[-3000:]
    two = cwd / "lightning_logs" / "residual" / "version_0"

    main(["fit", *NODES_RUN, *ONE, "--data.batch_size", "8"])  # in in_tmp's folder
    one = Path("lightning_logs") / "residual" / "version_0"
    got, want = scalars(two), scalars(one)
    assert sorted(got) == sorted(want)
    for tag in want:
        if tag != "loss/train_step":  # process 0's 4 windows, not the step's 8
            assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
            assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want[tag]], abs=1e-4), tag
    got, want = (torch.load(run / "checkpoints" / "last.ckpt", weights_only=True) for run in (two, one))
    assert got["global_step"] == want["global_step"] == 2
    for name, tensor in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][name], tensor, atol=1e-5, rtol=0, msg=name)
