"""The numbers gpt_lit reports, each recomputed independently: test loss, lengths, diagnostics, tied weights."""

from __future__ import annotations

import copy
import json
import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import QUIET_TRAINER, REPO, TINY, residual_without_diagnostics, scalars, windows_by_hand
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from gpt_lit.book_source import default_data_dir, load_book
from gpt_lit.data import TimeMachineData
from gpt_lit.diagnostics import BlockGradNorms, PositionSimilarity
from gpt_lit.measure import position_similarity
from gpt_lit.model import GPT, GPTConfig
from gpt_lit.module import GPTLightning
from gpt_lit.run.cli import main
from gpt_lit.tokenizer import get_tokenizer

RUN = [
    "--config", str(REPO / "configs/residual.yaml"), *TINY, "--data.eval_train", "false",
    "--trainer.limit_train_batches", "2", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
]  # fmt: skip


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # lightning_logs/ goes here


VAL_SPLIT = 161_722  # the chapter's split: int(0.90 * 179,692 characters of the story)


def token_mean_loss_by_hand(model: GPT, ids: torch.Tensor, context_length: int, stride: int) -> tuple[float, int]:
    """F.cross_entropy over every token of every window of ``ids`` (windows counted by hand), and the window count."""
    x, y = windows_by_hand(ids, context_length, stride)
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(x), 16):  # 16 windows at a time: 16 x 32 x 50257 logits are 100 MB
            logits = model.eval()(x[i : i + 16])
            total += F.cross_entropy(logits.flatten(0, 1), y[i : i + 16].flatten(), reduction="sum").item()
    return total / y.numel(), len(x)


def greedy_by_hand(model: GPT, ids: list[int], n: int, context_length: int) -> list[int]:
    """The chapter's greedy loop, written out: argmax of the last position's logits on the last tokens."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(model.eval()(torch.tensor([ids[-context_length:]]))[0, -1].argmax().item())
    return ids


def test_validation_and_test_loss_are_the_token_mean_over_every_validation_window(tiny_run, monkeypatch):
    version = tiny_run.version
    model = GPTLightning.load_from_checkpoint(version / "checkpoints" / "last.ckpt").model
    val_ids = torch.tensor(get_tokenizer().encode(load_book(default_data_dir())[VAL_SPLIT:]))
    expected, n_windows = token_mean_loss_by_hand(model, val_ids, 32, 128)  # residual.yaml's stride: 128
    assert n_windows == 37  # eval batches of 16, 16 and 5 windows: the mean of batch means would differ
    untrained, _ = token_mean_loss_by_hand(GPT(model.cfg), val_ids, 32, 128)
    assert untrained - expected > 0.05  # the two checkpoints below are told apart from an untrained model

    # the run's last loss/val, as TensorBoard shows it, is the loss of the last checkpoint's weights
    assert tiny_run.last_val == pytest.approx(expected, abs=2e-5)
    assert scalars(version)["loss/val"][-1][1] == pytest.approx(expected, abs=2e-5)

    # `test` on that checkpoint (the test set is the validation set), in eval batches of 10, 10, 10 and 7 windows
    monkeypatch.chdir(tiny_run.root)
    ckpt = str(version / "checkpoints" / "best-epoch01.ckpt")
    args = ["--config", str(version / "config.yaml"), "--ckpt_path", ckpt, "--data.eval_batch_size", "10"]
    test = main(["test", *args, "--trainer.enable_progress_bar", "false"])
    assert test.trainer.callback_metrics["test/loss"].item() == pytest.approx(expected, abs=2e-5)
    assert test.trainer.callback_metrics["test/perplexity"].item() == pytest.approx(math.exp(expected), rel=1e-4)


def test_predict_appends_max_new_tokens_greedily_to_each_prompt(tiny_run, monkeypatch):
    version = tiny_run.version
    monkeypatch.chdir(tiny_run.root)
    ckpt = str(version / "checkpoints" / "last.ckpt")
    long = (
        "The Time Traveller (for so it will be convenient to speak of him) was expounding a recondite matter to us. "
        "His grey eyes shone and twinkled, and his usually pale face was flushed and animated."
    )
    prompts = ["The Time Traveller", "It was", long]  # the third has more tokens than the context of 32
    with pytest.warns(UserWarning, match="prompt 3 has"):
        predict = main(["predict", "--config", f"{version}/config.yaml", "--ckpt_path", ckpt, "--data.prompts",
                        json.dumps(prompts), "--model.max_new_tokens", "7"])  # fmt: skip
    enc = get_tokenizer()
    model = GPTLightning.load_from_checkpoint(ckpt).model
    outs = [out for [out] in predict.trainer.predict_loop.predictions]
    assert len(outs) == 3
    for out, prompt in zip(outs, prompts, strict=True):
        assert out["prompt"] == enc.encode(prompt) and len(out["new"]) == 7
        assert out["prompt"] + out["new"] == greedy_by_hand(model, enc.encode(prompt), 7, 32)
        assert out["text"] == enc.decode(out["prompt"] + out["new"])


class Capture(Callback):
    """The weights and the batch of every training step, as the step starts."""

    def __init__(self):
        self.steps: list[tuple[dict, tuple]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps.append((copy.deepcopy(pl_module.model.state_dict()), tuple(t.clone() for t in batch)))


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    """2 epochs of 2 steps of a 3-block model without dropout, every step logged; clipped far below the norms."""
    L.seed_everything(123)
    cfg = GPTConfig(context_length=32, emb_dim=32, n_layers=3, n_heads=2, dropout=0.0)
    data = TimeMachineData(context_length=32, stride=128, batch_size=4, eval_batch_size=64, eval_train=False)
    module, capture = GPTLightning(cfg), Capture()
    logger = TensorBoardLogger(tmp_path_factory.mktemp("fit"), name="tiny", default_hp_metric=False)
    trainer = L.Trainer(
        **QUIET_TRAINER,
        logger=logger,
        callbacks=[BlockGradNorms(), PositionSimilarity(num_sequences=8), capture],
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=1,
        log_every_n_steps=1,
        gradient_clip_val=1e-3,
    )
    trainer.fit(module, data)
    return cfg, data, module, capture, scalars(logger.log_dir)


def test_logged_grad_norms_are_the_norms_of_the_gradients(diagnosed):
    cfg, _, _, capture, logged = diagnosed
    for step, (weights, (x, y)) in enumerate(capture.steps):
        model = GPT(cfg)
        model.load_state_dict(weights)
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()  # the chapter's loss, plainly
        for i, block in enumerate(model.blocks, 1):
            (logged_step, value) = logged[f"grad_norm/block_{i}"][step]
            assert logged_step == step
            assert value == pytest.approx(torch.linalg.vector_norm(block.ffn.fc.weight.grad).item(), rel=1e-4)


def test_logged_similarity_is_position_similarity_of_the_first_validation_windows(diagnosed):
    cfg, data, module, capture, logged = diagnosed
    windows = torch.stack([data.val_set[i][0] for i in range(8)])
    start = GPT(cfg)
    start.load_state_dict(capture.steps[0][0])  # the weights before the first step
    with torch.no_grad():
        expected = [position_similarity(m.eval().hidden_states(windows)).mean().item() for m in (start, module.model)]
    values = [v for _, v in logged["similarity/positions"]]
    assert [values[0], values[-1]] == pytest.approx(expected, abs=1e-6)
    assert abs(expected[0] - expected[1]) > 1e-4  # training moved it: the two checks are of different models


def test_tied_model_trains_saves_loads_and_resumes_with_the_head_still_the_embedding():
    tied = ["--model.config.tie_weights", "true", "--model.config.emb_dim", "64", "--data.eval_train", "false"]
    run = ["--config", residual_without_diagnostics(), *RUN[2:]]  # RUN's, without the diagnostics: none is read
    first = main(["fit", *run, *tied, "--trainer.max_epochs", "1", "--trainer.logger.init_args.name", "tied"])
    gpt = first.model.model
    assert gpt.head.weight is gpt.tok_emb.weight
    ckpt = f"{first.trainer.log_dir}/checkpoints/last.ckpt"

    loaded = GPTLightning.load_from_checkpoint(ckpt).model
    assert loaded.head.weight is loaded.tok_emb.weight  # the same tensor, not a copy
    assert torch.equal(loaded.head.weight, gpt.head.weight)

    resumed = main(["fit", *run, *tied, "--trainer.max_epochs", "2", "--ckpt_path", ckpt,
                    "--trainer.logger.init_args.name", "tied", "--trainer.logger.init_args.version", "0"])  # fmt: skip
    gpt = resumed.model.model
    assert gpt.head.weight is gpt.tok_emb.weight
    [params] = [group["params"] for group in resumed.trainer.optimizers[0].param_groups]
    assert sum(p is gpt.tok_emb.weight for p in params) == 1 and len(params) == len(list(gpt.parameters()))
    assert [s for s, _ in scalars(first.trainer.log_dir)["loss/train_step"]] == [0, 1, 2, 3]  # continued the run
