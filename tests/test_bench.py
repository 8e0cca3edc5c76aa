"""The speed options and the benchmark are correct: same numbers as the plain loop, right FLOP counts. No timings."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

from gpt_lit.data import TimeMachineData
from gpt_lit.loss import _losses_from_softmax, token_losses, vocab_blocked_token_losses
from gpt_lit.model import GPT, GPTConfig, count_params
from gpt_lit.module import GPTLightning

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402 (scripts/bench.py)
from conftest import TINY as TINY_CLI  # noqa: E402 (the CLI options of a tiny model)
from conftest import load_script  # noqa: E402

TINY = GPTConfig(vocab_size=300, context_length=16, emb_dim=32, n_layers=2, n_heads=2, dropout=0.0)


def windows(n: int = 12, cfg: GPTConfig = TINY) -> TensorDataset:
    ids = torch.randint(0, cfg.vocab_size, (n, cfg.context_length + 1), generator=torch.Generator().manual_seed(0))
    return TensorDataset(ids[:, :-1], ids[:, 1:])


class LossRecorder(Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())


def lightning_losses(precision: str, steps: int = 4, **options) -> tuple[list[float], GPTLightning]:
    """Losses of ``steps`` AdamW steps (lr 0.01) on one batch of 3 windows, through the Lightning Trainer."""
    torch.manual_seed(123)
    module = GPTLightning(TINY, lr=0.01, **options)
    recorder = LossRecorder()
    trainer = L.Trainer(
        accelerator="cpu",
        precision=precision,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    trainer.fit(module, DataLoader(windows(3), batch_size=3))
    return recorder.losses, module


def test_matmul_params_is_the_hand_count_and_the_models_linear_weights():
    # per block: qkv 3*32*32 + proj 32*32 + fc 32*128 + proj 128*32 = 12*32^2 = 12288; head 300*32 = 9600
    assert bench.matmul_params(TINY) == 2 * 12288 + 9600 == 34176
    linear_weights = sum(m.weight.numel() for m in GPT(TINY).modules() if isinstance(m, nn.Linear))
    assert bench.matmul_params(TINY) == linear_weights


def test_train_flops_formula_matches_pytorchs_flop_counter():
    # 6N + 12 L T d per token: 6*34176 + 12*2*16*32 = 217344
    assert bench.train_flops_per_token(TINY, 16) == 217344
    model, (x, y) = GPT(TINY), windows(4)[:]
    # PyTorch counts every matmul, forward and backward; attention written out as matmuls (SDPA's math backend)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    assert counter.get_total_flops() == bench.train_flops_per_token(TINY, 16) * x.numel()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    assert counter.get_total_flops() == bench.eval_flops_per_token(TINY, 16) * x.numel()


def test_head_cross_entropy_equals_linear_then_cross_entropy():
    torch.manual_seed(0)
    h0, w0, t = torch.randn(40, 32), torch.randn(300, 32), torch.randint(0, 300, (40,))
    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    expected = F.cross_entropy(F.linear(h1, w1), t)
    (3 * expected).backward()
    got = token_losses(h2, w2, t).mean()
    (3 * got).backward()
    assert got.item() == pytest.approx(expected.item(), abs=1e-5)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # evaluation: no graph
        assert token_losses(h0, w0, t).mean().item() == pytest.approx(expected.item(), abs=1e-5)


def test_each_tokens_loss_has_its_own_gradient():
    # A weighted sum of the per-token losses (what a loss by position would backpropagate): each token's gradient
    # is scaled by its own weight, as autograd through F.cross_entropy(reduction="none") gives it.
    torch.manual_seed(1)
    h0, w0, t = torch.randn(30, 16), torch.randn(200, 16), torch.randint(0, 200, (30,))
    weights = torch.rand(30)
    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    (F.cross_entropy(F.linear(h1, w1), t, reduction="none") * weights).sum().backward()
    (token_losses(h2, w2, t) * weights).sum().backward()
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-6)


def test_head_cross_entropy_is_exact_where_the_target_probability_underflows():
    # Targets hundreds of nats away from the top logit: their softmax probability is 0 in float32, so the loss
    # must come from logsumexp, not from -log p[t]; the other rows keep the fast path.
    torch.manual_seed(0)
    h, w = torch.randn(40, 32) * 30, torch.randn(300, 32)
    t = torch.randint(0, 300, (40,))
    logits = F.linear(h, w)
    far = F.cross_entropy(logits, t, reduction="none") > 69
    assert 0 < far.sum() < 40  # both kinds of rows are there
    assert (logits.softmax(-1).gather(1, t[:, None]).squeeze(1)[far] < 1e-30).all()
    got = token_losses(h.requires_grad_(), w, t).mean()
    assert math.isfinite(got.item())
    assert got.item() == pytest.approx(F.cross_entropy(logits, t).item(), rel=1e-6)
    # Both ways of taking the losses from the softmax (CPU's, and the GPU's with no host check) are exact.
    expected = F.cross_entropy(logits, t, reduction="none")
    for host_check in (True, False):
        got = _losses_from_softmax(logits, logits.softmax(-1), t, host_check)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("block", [7, 64, 300, 1000])  # blocks that do not divide 300, divide it, are it, exceed it
def test_vocab_blocked_token_losses_equal_cross_entropy_per_token(block):
    # The logit lens's read-out: the logsumexp accumulated block by block. Some rows' logits span hundreds of
    # nats (the running maximum must rescale what was summed before a larger logit came).
    torch.manual_seed(0)
    h, w, t = torch.randn(40, 32), torch.randn(300, 32), torch.randint(0, 300, (40,))
    h[::3] *= 30
    expected = F.cross_entropy(F.linear(h, w), t, reduction="none")
    assert expected.max() > 100  # far rows are there
    torch.testing.assert_close(vocab_blocked_token_losses(h, w, t, words=block), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_plain_path_is_cross_entropy_to_the_last_bit(dtype):
    # fp16 and sharded runs take it: each token's loss, and its gradient, are F.cross_entropy's on the fp32 logits.
    torch.manual_seed(0)
    logits, t = (torch.randn(50, 300) * 4).to(dtype), torch.randint(0, 300, (50,))
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    expected = F.cross_entropy(a.float(), t, reduction="none")
    per_token = token_losses(b, None, t)
    assert torch.equal(per_token, expected)
    expected.mean().backward(), per_token.mean().backward()
    assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_evaluation_losses_equal_cross_entropy_to_float_rounding(precision):
    # Evaluation's tiles (rows x words) on a batch of several tiles each way, neither dividing it: the mean is
    # F.cross_entropy's to 1e-6 relative (not to the last bit), each token's loss to float rounding. Under
    # bf16-mixed, as F.linear's bf16 logits taken to fp32.
    torch.manual_seed(0)
    h, w, t = torch.randn(600, 64), torch.randn(5000, 64) * 0.3, torch.randint(0, 5000, (600,))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        logits = F.linear(h, w).float()
        per_token = vocab_blocked_token_losses(h, w, t, tokens=256)
        mean = token_losses(h, w, t).mean()  # without gradients: the mean of the same losses, in one tile of tokens
    expected = F.cross_entropy(logits, t, reduction="none")
    assert mean.item() == pytest.approx(expected.mean().item(), rel=1e-6)
    torch.testing.assert_close(per_token, expected, rtol=1e-6, atol=1e-5)


def test_lightning_fp32_losses_equal_the_plain_pytorch_loop():
    """GPTLightning with its speed options (fused loss, fused AdamW) through the Trainer gives the losses of the
    chapter's loop written plainly: logits, F.cross_entropy, AdamW, the same seed and batch."""
    losses, _ = lightning_losses("32-true")
    torch.manual_seed(123)
    model = GPT(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    plain, (x, y) = [], windows(3)[:]
    for _ in range(4):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        plain.append(loss.item())
    assert len(losses) == len(plain) == 4
    assert losses == pytest.approx(plain, abs=1e-5)
    assert plain[-1] < plain[0]  # it trained


def test_unfused_options_give_the_same_losses():
    fused, _ = lightning_losses("32-true")
    unfused, _ = lightning_losses("32-true", fused_loss=False, fused_adamw=False, keep_cpu_memory=False)
    assert fused == pytest.approx(unfused, abs=1e-5)


def test_bf16_mixed_trains_on_cpu_and_keeps_fp32_weights():
    fp32, _ = lightning_losses("32-true")
    bf16, module = lightning_losses("bf16-mixed")
    assert all(math.isfinite(x) for x in bf16)
    assert bf16[-1] < bf16[0]
    assert bf16 == pytest.approx(fp32, abs=0.05)  # the same run, to bf16's precision
    assert all(p.dtype == torch.float32 for p in module.parameters())


def script_figures(capsys, monkeypatch, script: str, *args: str, **replace) -> tuple[dict[str, str], str]:
    """scripts/<script>'s main, as `python scripts/<script> <args>` runs it, in this process (loaded with importlib,
    its functions named in ``replace`` replaced); its ``name: value`` lines as a dict, and its whole output."""
    module = load_script(script.removesuffix(".py"))
    for name, value in replace.items():
        monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(sys, "argv", [script, *args])  # time_run reads sys.argv
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # leave this process's threads alone
    level = logging.getLogger("lightning.pytorch").level  # the scripts quieten Lightning's logger: put it back
    try:
        module.main(list(args)) if script == "bench.py" else module.main()
    finally:
        logging.getLogger("lightning.pytorch").setLevel(level)
    out = capsys.readouterr().out
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line), out


def test_bench_smoke_prints_every_figure(capsys, monkeypatch):
    figures, out = script_figures(capsys, monkeypatch, "bench.py", "--smoke")
    for name in (
        "lightning_vs_bare",
        "gpt_lit_vs_hf",
        "mfu",
        "mfu_matmul_only",
        "plain_mfu",
        "gpt_lit_vs_plain",
        "eval_vs_train",
        "bf16_vs_fp32",
        "peak_memory_mb",
        "chapter_train_tokens_per_s",
        "chapter_bare_train_tokens_per_s",
        "chapter_hf_train_tokens_per_s",
        "chapter_eval_tokens_per_s",
        "chapter_peak_fp32_gflops",
        "gpt2_train_tokens_per_s",
        "gpt2_gpt_lit_vs_hf",
    ):
        assert name in figures, f"{name} missing from:\n{out}"
    settings = ("device", "precision", "compile", "tf32", "keep_cpu_memory")
    values = {k: float(v) for k, v in figures.items() if k not in settings}
    assert all(v > 0 and math.isfinite(v) for v in values.values()), values
    # the ratios are the ratios of the printed rates
    ratio = values["chapter_train_tokens_per_s"] / values["chapter_bare_train_tokens_per_s"]
    assert values["lightning_vs_bare"] == pytest.approx(ratio, rel=1e-3)
    smoke = GPTConfig(vocab_size=512, context_length=16, emb_dim=32, n_layers=2, n_heads=2)
    n_all = sum(p.numel() for p in GPT(smoke).parameters())
    assert values["chapter_params"] == n_all
    assert values["chapter_train_flops_per_token"] == bench.train_flops_per_token(smoke, 16, n_all)
    assert values["chapter_train_matmul_flops_per_token"] == bench.train_flops_per_token(smoke, 16)
    # mfu and mfu_matmul_only are the same rate over the same peak, in the two FLOP counts
    assert values["mfu"] / values["mfu_matmul_only"] == pytest.approx(
        bench.train_flops_per_token(smoke, 16, n_all) / bench.train_flops_per_token(smoke, 16), rel=1e-3
    )


def test_compiled_model_gives_the_same_losses_and_checkpoint_keys():
    eager, _ = lightning_losses("32-true", steps=3)
    compiled, module = lightning_losses("32-true", steps=3, compile=True)
    assert compiled == pytest.approx(eager, abs=1e-5)
    assert "model.tok_emb.weight" in module.state_dict()  # no _orig_mod. prefix: checkpoints load either way


def test_time_run_counts_the_runs_tokens_and_flops(book_path, capsys, monkeypatch):
    """scripts/time_run.py on one epoch of a tiny residual.yaml: the tokens it counts are the run's windows."""
    monkeypatch.chdir(ROOT)
    args = ["configs/residual.yaml", "--trainer.max_epochs", "1", *TINY_CLI, "--trainer.limit_train_batches", "3"]
    # the machine's peak (a 2048 x 2048 matmul, 22 times) is the script's to measure, not this test's: 0.5 GFLOP/s,
    # so the steps' matmuls take longer than the steps (train_rest < 0) and a part left out shows in the sum
    figures, _ = script_figures(capsys, monkeypatch, "time_run.py", *args, matmul_peak=lambda reps=10: 5e8)
    dm = TimeMachineData(context_length=32, stride=128, batch_size=4)
    dm.setup("fit")
    T, val_windows = 32, len(dm.val_set)
    assert (len(dm.train_set), val_windows) == (317, 37)  # 32 tokens every 128 (residual.yaml's stride)
    assert int(figures["epochs"]) == 1
    assert int(figures["train_tokens"]) == 3 * 4 * T  # 3 batches of 4 windows
    assert int(figures["eval_tokens"]) == (317 + 37) * T  # both whole sets, once
    cfg = GPTConfig(vocab_size=50257, context_length=T, emb_dim=32, n_layers=2, n_heads=2)
    n = count_params(GPT(cfg))
    flops = int(figures["train_tokens"]) * (6 * n + 12 * 2 * T * 32) + int(figures["eval_tokens"]) * (
        2 * n + 4 * 2 * T * 32
    )
    assert float(figures["flops"]) == pytest.approx(flops, rel=1e-3)
    assert float(figures["flops_over_peak_s"]) == pytest.approx(flops / 5e8, rel=1e-3)
    assert float(figures["peak_fp32_gflops_mean"]) == 0.5  # before, before the epoch's evaluation, after
    assert float(figures["wall_vs_flops"]) == pytest.approx(
        float(figures["wall_s"]) / float(figures["flops_over_peak_s"]), rel=1e-2
    )
    assert float(figures["wall_s"]) > float(figures["fit_s"]) > 0
    # Where the time went: the parts add up to the wall time; the steps' matmuls are their FLOPs over the peak
    parts = {k.removeprefix("time/").removesuffix("_s"): float(v) for k, v in figures.items() if k.startswith("time/")}
    assert sorted(parts) == sorted(["start", "train_matmul", "train_rest", "eval", "checkpoints", "diagnostics", "end"])
    assert sum(parts.values()) == pytest.approx(float(figures["wall_s"]), rel=1e-3)
    n = 12 * 2 * 32**2 + 50257 * 32  # matmul weights: the blocks, the head
    assert parts["train_matmul"] == pytest.approx(3 * 4 * T * (6 * n + 12 * 2 * T * 32) / 5e8, rel=1e-3)
    assert all(seconds > 0 for part, seconds in parts.items() if part != "train_rest"), parts  # a save: last.ckpt
    assert 0 < float(figures["loss/train"]) < 11 and 0 < float(figures["loss/val"]) < 11
