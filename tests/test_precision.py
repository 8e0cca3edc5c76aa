"""Mixed precision changes the speed, not the answer: clipping works, and the gradient norms are the true ones."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from conftest import QUIET_TRAINER
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import MixedPrecision

from gpt_lit.data import TimeMachineData
from gpt_lit.diagnostics import BlockGradNorms
from gpt_lit.model import GPTConfig
from gpt_lit.module import GPTLightning


class Norms(Callback):
    """What BlockGradNorms measured at each step (its ``latest`` keeps only the last)."""

    def __init__(self):
        self.steps: list[list[float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        [grads] = [cb for cb in trainer.callbacks if isinstance(cb, BlockGradNorms)]
        step, norms = grads.latest
        assert step == trainer.global_step - 1  # this batch's optimizer step
        self.steps.append(norms)


def fit(steps: int, **trainer_kwargs) -> tuple[GPTLightning, Norms]:
    """``steps`` training steps of a tiny model without dropout (so runs differ only by their precision)."""
    L.seed_everything(123)
    data = TimeMachineData(context_length=32, stride=128, batch_size=4, eval_batch_size=64)
    model = GPTLightning(GPTConfig(context_length=32, emb_dim=32, n_layers=2, n_heads=2, dropout=0.0))
    norms = Norms()
    trainer = L.Trainer(
        **QUIET_TRAINER,
        logger=False,
        callbacks=[BlockGradNorms(), norms],
        max_steps=steps,
        limit_val_batches=0,
        log_every_n_steps=1,
        **trainer_kwargs,
    )
    trainer.fit(model, data)
    return model, norms


def test_bf16_mixed_with_gradient_clipping_trains(caplog):
    with caplog.at_level(logging.INFO):
        model, _ = fit(2, precision="bf16-mixed", gradient_clip_val=1.0)
    assert model.trainer.global_step == 2
    assert not model.trainer.optimizers[0].defaults["fused"]  # Lightning cannot clip before a fused step
    said = [r.getMessage() for r in caplog.records if "unfused AdamW" in r.getMessage()]
    assert said == ["model.fused_adamw: using the unfused AdamW under bf16-mixed with gradient clipping: "
                    "Lightning needs it to clip them"]  # fmt: skip


def test_fp32_keeps_the_fused_adamw():
    model, _ = fit(1, gradient_clip_val=1.0)
    assert model.trainer.optimizers[0].defaults["fused"]


def test_grad_norms_under_16_mixed_are_of_the_unscaled_gradients():
    # fp16 autocast with a loss scale of 2**16, on the CPU: what 16-mixed does on a GPU.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    model, fp16 = fit(2, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    _, fp32 = fit(2)
    assert not model.uses_fused_loss()  # fp16 takes the plain F.cross_entropy(model(x)) path
    # Step 0: the same weights and batch; fp16 rounding moves the norms by far less than 1%, the scale by 65536x.
    assert fp16.steps[0] == pytest.approx(fp32.steps[0], rel=1e-2)
    assert fp16.steps[1] == pytest.approx(fp32.steps[1], rel=5e-2)
