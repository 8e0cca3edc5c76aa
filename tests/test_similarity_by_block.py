"""Similarity between positions after every block: the chapter's untrained 12-block setting, block by block."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from conftest import chapter_experiment, load_script  # each experiment once per session
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

from gpt_lit.distributed import shards_parameters
from gpt_lit.measure import position_similarity
from gpt_lit.model import GPT, GPTConfig


def experiment(residual: bool):
    return chapter_experiment(residual, 12)


def test_block_12_with_residuals_is_the_chapters_0563():
    row = experiment(True).similarity_by_block
    assert len(row) == 12
    assert f"{row[-1]:.3f}" == "0.563"  # the chapter's table, measured at the top of the stack
    assert row[-1] == pytest.approx(experiment(True).similarity, abs=1e-6)


def test_without_residuals_similarity_grows_block_by_block_to_one():
    row = experiment(False).similarity_by_block
    assert f"{row[-1]:.3f}" == "1.000"
    assert all(b >= a - 1e-4 for a, b in zip(row, row[1:], strict=False))  # each round of averaging adds to it
    assert row[0] < 0.9 < row[3]  # not alike after one block, nearly the same vector after four
    assert all(w < p for w, p in zip(experiment(True).similarity_by_block, row, strict=True))


def test_first_block_by_hand():
    """Block 1's value is the similarity of block 1's output, computed without the forward hooks."""
    torch.manual_seed(123)
    cfg = GPTConfig(emb_dim=256, n_heads=4, n_layers=12, context_length=64, dropout=0.0, residual=True)
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (4, 64))
    with torch.no_grad():
        h = model.blocks[0](model.tok_emb(x[:1]) + model.pos_emb(torch.arange(64)))
    assert experiment(True).similarity_by_block[0] == pytest.approx(position_similarity(h).item(), abs=1e-6)


def test_reproduce_chapter_prints_the_whole_row_with_and_without_residuals(capsys):
    script = load_script("reproduce_chapter")
    script.similarity_by_block(experiment(True), experiment(False))
    lines = capsys.readouterr().out.splitlines()
    with_ = next(line for line in lines if line.startswith("With residuals")).split()[2:]
    without = next(line for line in lines if line.startswith("Without")).split()[1:]
    assert with_ == [f"{v:.3f}" for v in experiment(True).similarity_by_block] and with_[-1] == "0.563"
    assert without == [f"{v:.3f}" for v in experiment(False).similarity_by_block] and without[-1] == "1.000"


def test_model_running_diagnostics_skip_strategies_that_shard_parameters(caplog):
    with caplog.at_level(logging.INFO):
        assert shards_parameters(SimpleNamespace(strategy=FSDPStrategy()), "PositionSimilarity")
        assert not shards_parameters(SimpleNamespace(strategy=DDPStrategy()), "PositionSimilarity")
    assert [r.getMessage() for r in caplog.records] == [
        "PositionSimilarity: skipped under FSDPStrategy, which shards the parameters"
    ]
