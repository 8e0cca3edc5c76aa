"""The Throughput callback: tokens per second and MFU in TensorBoard, with FLOPs counted by hand from the model's
matmul weights, and the rates the run's own counters give."""

import lightning as L
import pytest
import torch
import torch.nn as nn
from conftest import QUIET_TRAINER, scalars
from lightning.pytorch.loggers import TensorBoardLogger

from gpt_lit.data import TimeMachineData
from gpt_lit.diagnostics import Throughput
from gpt_lit.flops import matmul_peak
from gpt_lit.model import GPTConfig
from gpt_lit.module import GPTLightning

T = 32


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One epoch of 4 steps and an evaluation of 3 batches (16, 16 and 5 windows) of a tiny model, rates over 2."""
    L.seed_everything(123)
    module = GPTLightning(GPTConfig(context_length=T, emb_dim=32, n_layers=2, n_heads=2))
    data = TimeMachineData(context_length=T, batch_size=4, eval_batch_size=16, eval_train=False)
    callback = Throughput(window_size=2)
    logger = TensorBoardLogger(tmp_path_factory.mktemp("throughput"), name="tiny", default_hp_metric=False)
    trainer = L.Trainer(
        **QUIET_TRAINER, logger=logger, callbacks=[callback], max_epochs=1, limit_train_batches=4, log_every_n_steps=1
    )
    trainer.fit(module, data)
    return module, callback, scalars(logger.log_dir)


def matmul_weights(module: GPTLightning) -> int:
    return sum(m.weight.numel() for m in module.model.modules() if isinstance(m, nn.Linear))


def test_tokens_per_second_are_the_tokens_over_the_time_between_steps(run):
    _, _, logged = run
    rates = dict(logged["train/device/items_per_sec"])
    assert sorted(rates) == [1, 2, 3]  # from the second step on (a window of 2)
    time, tokens = dict(logged["train/time"]), dict(logged["train/lengths"])
    for step in rates:  # the step's tokens (4 windows of 32) over its time
        assert tokens[step] - tokens[step - 1] == 4 * T
        assert rates[step] == pytest.approx(4 * T / (time[step] - time[step - 1]), rel=1e-4)


@pytest.mark.parametrize(("stage", "per_token"), [("train", (6, 12)), ("validate", (2, 4))])
def test_mfu_counts_the_flops_of_the_matmuls_over_the_measured_peak(run, stage, per_token):
    module, callback, logged = run
    n, a = matmul_weights(module), per_token
    flops_per_token = a[0] * n + a[1] * 2 * T * 32  # 6 N + 12 n_layers T emb_dim (evaluation: 2 N + 4 ...)
    tokens, flops = logged[f"{stage}/device/items_per_sec"], logged[f"{stage}/device/flops_per_sec"]
    mfu = logged[f"{stage}/device/mfu"]
    assert len(mfu) == len(tokens) >= 1
    for (_, rate), (_, flop_rate), (_, used) in zip(tokens, flops, mfu, strict=True):
        assert flop_rate == pytest.approx(rate * flops_per_token, rel=1e-4)
        assert used == pytest.approx(flop_rate / callback.peak, rel=1e-4)
    assert 1e8 < callback.peak < 1e16  # a measured rate in FLOP/s


def test_measuring_the_peak_leaves_the_runs_random_numbers_alone():
    # The callback measures the peak in setup, after seeding and before training: dropout's masks must not change.
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    matmul_peak("cpu", reps=1, n=64)
    assert torch.rand(3).equal(expected)


def test_the_peak_is_measured_once_per_process_for_each_device_dtype_and_thread_count(monkeypatch):
    # A notebook's (or a test session's) second run reuses the first run's measurement.
    from gpt_lit import flops

    measured = []
    monkeypatch.setattr(flops, "matmul_peak", lambda device, dtype, n=0, reps=0: measured.append(dtype) or 1e10)
    flops.measured_peak.cache_clear()
    try:
        cpu = torch.device("cpu")
        assert flops.measured_peak(cpu, torch.float32, 1) == 1e10
        flops.measured_peak(cpu, torch.float32, 1)
        flops.measured_peak(cpu, torch.bfloat16, 1)
        flops.measured_peak(cpu, torch.float32, 2)
        assert measured == [torch.float32] * 2 + [torch.bfloat16] * 2 + [torch.float32] * 2  # a small mm, then 2048
    finally:
        flops.measured_peak.cache_clear()


def test_a_dtype_without_a_fast_kernel_is_measured_on_a_small_matmul_only(monkeypatch):
    # bf16 on a CPU without bf16 units runs on PyTorch's reference kernel: one 2048 x 2048 mm takes minutes there.
    from gpt_lit import flops

    sizes = []
    rates = {512: flops.SLOW / 4, 2048: flops.SLOW / 5}  # the reference kernel's rate falls with n
    monkeypatch.setattr(flops, "matmul_peak", lambda device, dtype, n=2048, reps=10: sizes.append(n) or rates[n])
    flops.measured_peak.cache_clear()
    try:
        assert flops.measured_peak(torch.device("cpu"), torch.bfloat16, 1) == flops.SLOW / 4
        assert sizes == [512]
    finally:
        flops.measured_peak.cache_clear()


def test_predict_measures_no_peak(monkeypatch):
    # Generation has no FLOP count (tokens per second only): predict spends no time measuring a peak it cannot use.
    from gpt_lit import flops

    measured = []
    monkeypatch.setattr(flops, "matmul_peak", lambda *args, **kwargs: measured.append(args) or 1e10)
    flops.measured_peak.cache_clear()
    try:
        module = GPTLightning(GPTConfig(context_length=T, emb_dim=32, n_layers=2, n_heads=2), max_new_tokens=2)
        callback = Throughput(window_size=2)
        trainer = L.Trainer(**QUIET_TRAINER, logger=False, callbacks=[callback])
        trainer.predict(module, TimeMachineData(context_length=T, prompts=["I saw", "It was"]))
        assert measured == [] and callback.peak is None
    finally:
        flops.measured_peak.cache_clear()
