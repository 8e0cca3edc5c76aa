"""`python -m gpt_lit` as a reader uses it: every shipped config builds; fit, then test and predict."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY

from gpt_lit.cli import GPTLitCLI
from gpt_lit.data import TimeMachineData
from gpt_lit.model import count_params
from gpt_lit.module import GPTLightning

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def gpt_lit(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpt_lit", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_configs_are_shipped():
    names = {c.stem for c in CONFIGS}
    assert {"residual", "no_residual", "residual_8", "no_residual_8", "gpt2_124m"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_builds(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # loggers and checkpoints would go here
    cli = GPTLitCLI(GPTLightning, TimeMachineData, args=["--config", str(config)], run=False)
    cfg, text = cli.model.model.cfg, config.read_text()
    # the links: the model's position table and vocabulary come from the data
    assert cfg.context_length == cli.datamodule.context_length and cfg.vocab_size == 50257
    assert "#" in text  # commented
    if config.stem.startswith("gpt2_124m"):  # GPT-2 124M, tied; the fine-tune keeps 256 of its 1024 positions
        assert count_params(cli.model.model) == 124_439_808 - (1024 - cfg.context_length) * 768
        return
    depth = 8 if config.stem.endswith("_8") else 4
    assert (cfg.n_layers, cfg.emb_dim, cfg.n_heads, cfg.context_length, cfg.dropout) == (depth, 256, 4, 128, 0.1)
    assert cfg.residual == (not config.stem.startswith("no_"))
    assert cli.trainer.max_epochs == 10 and cli.datamodule.batch_size == 16
    assert cli.config["seed_everything"] == 123
    assert Path(cli.trainer.logger.log_dir).parent.name == config.stem  # lightning_logs/<run name>/version_N


def test_help_explains_every_option(tmp_path):
    out = gpt_lit("fit", "--help", cwd=tmp_path).stdout
    for option, words in {
        "--model.config.emb_dim": "Width of every token vector",
        "--model.config.residual": "Residual connections",
        "--model.lr": "AdamW learning rate",
        "--data.data_dir": "GPT_LIT_DATA_DIR",
        "--data.context_length": "Tokens per training window",
    }.items():
        assert option in out and words in out, option
    assert "data.context_length --> model.config.context_length" in out


def test_fit_then_test_and_predict_on_the_checkpoint(tmp_path):
    run = ["--config", str(REPO / "configs/residual.yaml"), *TINY, "--trainer.enable_progress_bar", "false"]
    fit = gpt_lit("fit", *run, "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3", cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    version = tmp_path / "lightning_logs" / "residual" / "version_0"
    ckpts = sorted(p.name for p in (version / "checkpoints").iterdir())
    assert "last.ckpt" in ckpts and any(p.startswith("best-epoch") for p in ckpts)
    state = torch.load(version / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["epoch"] == 1 and state["global_step"] == 6
    assert (version / "config.yaml").is_file()

    ckpt = str(version / "checkpoints" / "last.ckpt")
    test = gpt_lit("test", "--config", str(version / "config.yaml"), "--ckpt_path", ckpt, cwd=tmp_path)
    assert test.returncode == 0, test.stderr[-3000:]
    loss = float(re.search(r"test/loss\s*[│|]\s*([\d.]+)", test.stdout).group(1))
    ppl = float(re.search(r"test/perplexity\s*[│|]\s*([\d.]+)", test.stdout).group(1))
    assert 5.0 < loss < 10.9 and abs(ppl - torch.tensor(loss).exp().item()) / ppl < 1e-3

    predict = gpt_lit(
        "predict", "--config", str(version / "config.yaml"), "--ckpt_path", ckpt,
        "--data.prompts", '["The Time Traveller", "It was"]', "--model.max_new_tokens", "5", cwd=tmp_path,
    )  # fmt: skip
    assert predict.returncode == 0, predict.stderr[-3000:]
    written = sorted((tmp_path / "lightning_logs" / "residual").glob("version_*/continuations.txt"))
    assert len(written) == 1
    texts = written[0].read_text().strip().split("\n\n")
    assert len(texts) == 2 and texts[0].startswith("The Time Traveller") and texts[1].startswith("It was")
    assert texts[0] in predict.stdout


def test_prompts_from_a_file(tmp_path):
    (tmp_path / "prompts.txt").write_text("The Time Traveller\n\nAttention is\n")
    args = ["predict", "--config", str(REPO / "configs/gpt2_124m.yaml"), "--data.prompts", "[]"]
    out = gpt_lit(*args, "--data.prompts_file", "prompts.txt", "--model.config.tie_weights", "false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # seed 123, untied GPTConfig(): the chapter's gibberish, from the CLI
    assert "The Time Traveller preventionの� Const preventionの� needy Chris IV DOJanton Richard doubt" in out.stdout
    assert "Attention is retrospective programmer programmer programmer programmerLinkedIn" in out.stdout


def test_missing_accelerator_is_one_clear_line(tmp_path):
    out = gpt_lit("fit", "--config", str(REPO / "configs/residual.yaml"), "--trainer.accelerator", "mps", cwd=tmp_path)
    assert out.returncode != 0
    assert "MPS" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error:")
