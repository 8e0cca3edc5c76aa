"""What a Mac does differently, shown on Linux: DataLoader workers started with ``spawn`` (macOS's default start
method), and the choice of AdamW kernel on an MPS device."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from conftest import QUIET_TRAINER, TINY

from gpt_lit.model import GPTConfig
from gpt_lit.module import GPTLightning
from gpt_lit.run.cli import main

SHORT = [
    "--config", "residual", *TINY, "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1",
    "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "0",
    "--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
    "--trainer.callbacks", "[]",
]  # fmt: skip


class StepLosses(L.Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())


@pytest.mark.full  # each spawned worker imports torch and gpt_lit anew; one worker process: test_resume_windows.py
def test_fit_with_two_spawned_workers_trains_on_the_same_batches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    in_process, spawned = StepLosses(), StepLosses()
    main(["fit", *SHORT], extra_callbacks=[in_process])
    cli = main(["fit", *SHORT, "--data.num_workers", "2", "--data.multiprocessing_context", "spawn"],
               extra_callbacks=[spawned])  # fmt: skip
    loader = cli.trainer.train_dataloader
    assert loader.num_workers == 2 and loader.multiprocessing_context.get_start_method() == "spawn"
    assert len(spawned.losses) == 3
    # the workers, started fresh, hand over the same windows in the same order: the same losses, step by step
    assert spawned.losses == pytest.approx(in_process.losses, abs=1e-6)


def test_an_unknown_start_method_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *SHORT, "--data.num_workers", "2", "--data.multiprocessing_context", "thread"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: data.multiprocessing_context 'thread' is not a start method here; use one of ")
    assert "spawn" in err


def optimizer_on(device: str, monkeypatch) -> torch.optim.Optimizer:
    """The optimizer GPTLightning makes for bf16 parameters on ``device`` (the module's device patched: this
    machine has no MPS; the choice depends only on the device's type)."""
    model = GPTLightning(GPTConfig(context_length=32, emb_dim=32, n_layers=2, n_heads=2)).to(torch.bfloat16)
    model.trainer = L.Trainer(**QUIET_TRAINER, logger=False, precision="bf16-true")
    monkeypatch.setattr(GPTLightning, "device", property(lambda self: torch.device(device)))
    return model.configure_optimizers()


def test_adamw_is_unfused_on_mps(monkeypatch):
    # PyTorch's fused AdamW has no bf16 kernel on MPS before macOS 14 (pytorch/pytorch#141104)
    assert optimizer_on("mps", monkeypatch).defaults["fused"] is False
    assert optimizer_on("cpu", monkeypatch).defaults["fused"] is True  # the same model on the CPU: fused
