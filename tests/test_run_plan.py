"""The run plan (gpt_lit/run/folders.py): ``--ckpt_path`` resolved and its file read once, before anything is built;
the CLI and the model only read the plan."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import lightning
import pytest
import torch
from conftest import TINY
from jsonargparse import Namespace

from gpt_lit.model import GPTConfig
from gpt_lit.module import GPTLightning
from gpt_lit.run.cli import main
from gpt_lit.run.folders import make_plan

CONFIG = GPTConfig(vocab_size=50257, context_length=32, emb_dim=32, n_heads=2, n_layers=2)
LOADER_STATE = {"epoch": 0, "steps": 3, "epoch_done": False}


def save_run(root: Path, version: int, **extra) -> tuple[Path, dict[str, torch.Tensor]]:
    """A run folder ``lightning_logs/version_N`` with a config.yaml and a tiny model's ``checkpoints/last.ckpt``
    (with ``extra``'s keys)."""
    run = root / "lightning_logs" / f"version_{version}"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    torch.manual_seed(version)
    state = GPTLightning(CONFIG).state_dict()
    ckpt = {
        "state_dict": state,
        "hyper_parameters": {"config": vars(CONFIG)},
        "pytorch-lightning_version": lightning.__version__,
        **extra,
    }
    torch.save(ckpt, run / "checkpoints" / "last.ckpt")
    return run / "checkpoints" / "last.ckpt", state


def fit_config(root: Path, ckpt_path: str | None, trust: bool = False) -> Namespace:
    trainer = Namespace(logger=None, default_root_dir=str(root), callbacks=None)
    return Namespace(trainer=trainer, ckpt_path=ckpt_path, trust_checkpoint=trust, weights_only=None)


@pytest.fixture()
def loads(monkeypatch) -> list[str]:
    """The files ``torch.load`` reads from now on."""
    read, torch_load = [], torch.load

    def recorded(f, *args, **kwargs):
        read.append(str(f) if isinstance(f, (str, os.PathLike)) else f.name)  # a path, or an open file
        return torch_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", recorded)
    return read


def test_last_is_the_newest_runs_file_read_once(tmp_path, loads):
    save_run(tmp_path, 0)
    loops = {"fit_loop": {"state_dict": {"combined_loader": [LOADER_STATE]}}}  # where Lightning saves it
    path, state = save_run(tmp_path, 1, loops=loops)
    plan = make_plan(fit_config(tmp_path, "last"))
    assert (plan.ckpt_path, plan.run) == (str(path), path.parent.parent)
    assert loads == [str(path)]  # one read, of that file
    assert plan.weights_only
    # what the checks before the restore need, as the file has it
    assert plan.shapes == {k: tuple(v.shape) for k, v in state.items()}
    assert plan.config == vars(CONFIG) and plan.data_state == LOADER_STATE


def test_a_file_only_lightning_reads_is_not_read(tmp_path, loads):
    plan = make_plan(fit_config(tmp_path, "s3://bucket/x.ckpt"))
    assert loads == [] and plan.shapes is None and plan.run is None
    assert plan.ckpt_path == "s3://bucket/x.ckpt" and plan.weights_only
    trusted = make_plan(fit_config(tmp_path, "s3://bucket/x.ckpt", trust=True))
    assert not trusted.weights_only  # Lightning's restore loads it as the user trusts it
    fresh = make_plan(fit_config(tmp_path, None))
    assert fresh.ckpt_path is None and fresh.shapes is None


def test_validate_reads_the_checkpoint_once_before_lightnings_restore(tmp_path, monkeypatch, loads):
    """The weights come from the checkpoint: model.init_from (here a folder that does not exist) is neither fetched
    nor loaded, and Lightning's restore puts the file's weights into the model."""
    monkeypatch.chdir(tmp_path)
    path, state = save_run(tmp_path / "elsewhere", 0)
    cli = main([
        "validate", "--config", "residual", *TINY, "--trainer.limit_val_batches", "1", "--data.eval_batch_size", "4",
        "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
        "--model.init_from", str(tmp_path / "no_such_model"), "--ckpt_path", str(path),
    ])  # fmt: skip
    assert [Path(f).name for f in loads] == ["last.ckpt", "last.ckpt"]  # the plan's read, then Lightning's restore
    assert cli.plan.ckpt_path == str(path)
    restored = cli.model.state_dict()
    assert all(torch.equal(restored[k], v) for k, v in state.items())


def test_no_global_statement_in_gpt_lit():
    """Every piece of a run's state is passed explicitly (the plan, constructor arguments), none kept in a module."""
    package = Path(__file__).parent.parent / "gpt_lit"
    found = [
        f"{file.relative_to(package)}:{node.lineno}"
        for file in package.rglob("*.py")
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8")))
        if isinstance(node, ast.Global)
    ]
    assert found == []
