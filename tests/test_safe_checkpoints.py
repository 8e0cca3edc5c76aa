"""A checkpoint is data, not code: every checkpoint is loaded with ``weights_only``, one that would run code is
refused before any of it runs, and every checkpoint gpt_lit writes loads that way and resumes.

The runs are in-process (``main``) on the tiny model. The two-process checkpoint is checked in test_ddp.py, on
the two-process run that file already makes.
"""

import logging
import os
import pathlib
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.serialization import get_unsafe_globals_in_checkpoint

from gpt_lit.model import GPTConfig
from gpt_lit.run.checkpoints import read_checkpoint
from gpt_lit.run.cli import main

RUN = [
    "--config", "residual", *TINY,  # the shipped config's callbacks, including its ModelCheckpoint
    "--trainer.precision", "bf16-mixed",
    "--data.stride", "2048",  # a few windows: the whole-set evaluations take no time
    "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
# The reader's own ModelCheckpoint beside the config's: a checkpoint after every step
READER_CKPT = '--trainer.callbacks+={"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": ' \
    '{"dirpath": "reader", "every_n_train_steps": 1, "save_top_k": -1}}'  # fmt: skip
NOT_SET = "`weights_only` was not set"


class Touch:
    """Unpickles to ``pathlib.Path(path).touch()``: a file appears if the checkpoint's code runs."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


class SigtermAt(Callback):
    """SIGTERM to this process once training has reached ``step``, as a cluster's scheduler sends it."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_main(args: list[str], **kwargs):
    """``main(args)``, and its exit status (0 when it returns)."""
    try:
        return main(args, **kwargs), 0
    except SystemExit as e:
        return None, e.code


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two epochs of one step under bf16-mixed, SIGTERM at step 2 (epoch 1 finishes its evaluation and end first):
    the best checkpoint, the reader's checkpoint of each step, last.ckpt saved on the stop; then resumed from it,
    every ``torch.load`` of that run recorded."""
    cwd = tmp_path_factory.mktemp("run")
    logger = logging.getLogger("lightning.pytorch")  # Lightning's "not set" line comes from a logger under it
    records, level = Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    loads, torch_load = [], torch.load

    def recorded_load(f, *args, **kwargs):
        loads.append((Path(getattr(f, "name", f)).name, kwargs.get("weights_only")))  # a path, or an open file
        return torch_load(f, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:  # puts back the working folder and torch.load
        patch.chdir(cwd)
        try:
            fit = ["fit", *RUN, READER_CKPT, "--trainer.max_epochs", "2"]
            _, status = run_main(fit, extra_callbacks=[SigtermAt(2)])
            assert status == 143
            folder = cwd / "lightning_logs" / "residual" / "version_0"
            ckpt = folder / "checkpoints" / "last.ckpt"
            patch.setattr(torch, "load", recorded_load)
            resumed, status = run_main(["fit", "--config", str(folder / "config.yaml"), "--ckpt_path", str(ckpt)])
            assert status == 0
        finally:
            logger.removeHandler(records)
            logger.setLevel(level)
    return folder, resumed.trainer, records.messages, loads


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture()
def bomb(tmp_path) -> tuple[Path, Path]:
    """A Lightning-looking checkpoint whose unpickling creates ``marker``; and ``marker``."""
    marker = tmp_path / "code_ran"
    path = tmp_path / "shared_finetune.ckpt"
    torch.save({"state_dict": {}, "x": Touch(marker)}, path)
    torch.load(path, weights_only=False)  # what unpickling it does: it is a real bomb
    assert marker.exists()
    marker.unlink()
    return path, marker


def assert_refused(capsys, status: int, path: Path | str, refused: str) -> None:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and "Traceback" not in err, err[-3000:]
    assert errors == [
        f"error: checkpoint {path} was not loaded: it needs {refused}, which is not plain data (tensors, numbers, "
        f"strings, containers), and unpickling it would run code from the file; if you trust the file and where it "
        f"came from, add --trust_checkpoint true"
    ]


@pytest.mark.parametrize(
    "command", [["test"], ["predict", "--data.prompts", '["I"]'], ["validate"], ["fit", "--trainer.max_epochs", "1"]]
)
def test_a_checkpoint_that_runs_code_is_refused_before_it_runs(capsys, bomb, command):
    path, marker = bomb
    _, status = run_main([*command, "--config", "residual", *TINY, "--ckpt_path", str(path)])
    assert not marker.exists()
    assert_refused(capsys, status, path, "getattr")  # Path.touch is pickled as getattr(Path, "touch")


@pytest.mark.parametrize("which", ["last", "best"])
def test_ckpt_path_last_or_best_on_a_run_holding_one_is_refused(capsys, bomb, tmp_path, which):
    path, marker = bomb
    last = tmp_path / "lightning_logs" / "residual" / "version_0" / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    path.rename(last)  # `best` is found by reading last.ckpt: that read is refused too
    _, status = run_main(["test", "--config", "residual", *TINY, "--ckpt_path", which])
    assert not marker.exists()
    assert_refused(capsys, status, Path("lightning_logs/residual/version_0/checkpoints/last.ckpt"), "getattr")


def test_a_url_that_lightning_reads_itself_is_refused_too(capsys, bomb):
    # A URL is not read by the CLI first: Lightning's own restore loads it, with weights_only=True.
    path, marker = bomb
    url = path.as_uri()  # file:///...: through fsspec, as s3:// or http:// would be
    _, status = run_main(["test", "--config", "residual", *TINY, "--data.stride", "2048", "--ckpt_path", url])
    assert not marker.exists()
    assert_refused(capsys, status, url, "getattr")


def test_an_os_system_pickle_names_it(capsys, tmp_path):
    class System:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'code_ran'}",)

    torch.save({"state_dict": {}, "x": System()}, tmp_path / "x.ckpt")
    _, status = run_main(["test", "--config", "residual", *TINY, "--ckpt_path", "x.ckpt"])
    assert not (tmp_path / "code_ran").exists()
    assert_refused(capsys, status, "x.ckpt", f"{os.name == 'posix' and 'posix' or 'nt'}.system")


def test_every_checkpoint_a_run_writes_is_data_and_resumes(run):
    folder, resumed, messages, loads = run
    saved = sorted(folder.glob("checkpoints/*.ckpt")) + sorted((folder.parents[2] / "reader").glob("*.ckpt"))
    assert [p.name for p in saved] == [
        "best-epoch01.ckpt", "last.ckpt", "epoch=0-step=1.ckpt", "epoch=1-step=2.ckpt",
    ]  # fmt: skip
    for path in saved:
        # torch's own scan: nothing beyond what weights_only loads without being told ...
        assert get_unsafe_globals_in_checkpoint(path) == [], path.name
        # ... and Lightning's restore (Strategy.load_checkpoint -> TorchCheckpointIO) reads it as data
        assert TorchCheckpointIO().load_checkpoint(path, weights_only=True)["state_dict"], path.name
    assert resumed.global_step == 2 and resumed.current_epoch == 2  # resumed after step 2, finished epoch 1
    assert [w for f, w in loads if f == "last.ckpt"][:2] == [True, True]  # the CLI's read, then Lightning's restore
    assert not [m for m in messages if NOT_SET in m]  # Lightning's "defaulting to False" never came up


def test_a_checkpoint_of_a_module_made_in_python_loads(run, tmp_path):
    # GPTLightning(config=GPTConfig(...)) made in Python, not by the CLI, saves the dataclass itself.
    folder, *_ = run
    ckpt = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["config"] = GPTConfig(**ckpt["hyper_parameters"]["config"])
    torch.save(ckpt, tmp_path / "python.ckpt")
    read, needed_trust = read_checkpoint(str(tmp_path / "python.ckpt"))
    assert isinstance(read["hyper_parameters"]["config"], GPTConfig) and not needed_trust
    restored = TorchCheckpointIO().load_checkpoint(tmp_path / "python.ckpt", weights_only=True)
    assert restored["hyper_parameters"]["config"] == ckpt["hyper_parameters"]["config"]


def test_the_opt_in_loads_a_legacy_file_with_one_warning(run, tmp_path, capsys):
    folder, *_ = run
    ckpt = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["numpy_random_state"] = np.random.get_state()  # a numpy array: data, but weights_only cannot build it
    torch.save(ckpt, tmp_path / "legacy.ckpt")
    config = ["--config", str(folder / "config.yaml"), "--trainer.limit_test_batches", "1"]
    _, status = run_main(["test", *config, "--ckpt_path", "legacy.ckpt"])
    rebuild = ckpt["numpy_random_state"][1].__reduce__()[0]  # what pickle calls to rebuild the array
    assert_refused(capsys, status, "legacy.ckpt", f"{rebuild.__module__}.{rebuild.__name__}")

    cli, status = run_main(["test", *config, "--ckpt_path", "legacy.ckpt", "--trust_checkpoint", "true"])
    err = capsys.readouterr().err
    assert status == 0, err[-3000:]
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: checkpoint legacy.ckpt was loaded as code (--trust_checkpoint true): any code it carries has run"
    ]
    assert cli.trainer.callback_metrics["test/loss"] > 0  # restored by Lightning too, and evaluated
    # Trust is given per command: the run's config.yaml does not carry it to the next command.
    saved = (tmp_path / "lightning_logs" / "residual").glob("version_*/config.yaml")
    assert [p.read_text().count("trust_checkpoint: false") for p in saved] == [1]


def test_weights_only_false_is_not_a_second_switch(capsys):
    _, status = run_main(["test", "--config", "residual", *TINY, "--weights_only", "false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err == ["error: --weights_only false: to load a checkpoint you trust as code, use --trust_checkpoint true"]
