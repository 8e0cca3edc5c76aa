"""A reader's first run from the wheel: `pip install .` (not editable), then, in an empty folder with no network,
`python -m gpt_lit fit --config residual.yaml` (with a tiny model) trains on the shipped book and prints no noise.

Both steps start processes on purpose: pip, and `python -m gpt_lit` from the installed wheel, as a reader runs it."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, TINY

NOISE = ["Tip:", "litlogger", "LeafSpec", "deprecated", "weights_only", "FLOPs", "Warning"]


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=900, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built (offline, with the installed setuptools) from a copy of the repository's files."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("gpt_lit", "configs"):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / file, src / file)
    out = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
              "-w", str(tmp / "dist"), str(src))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (built,) = (tmp / "dist").glob("gpt_lit-*.whl")
    return built


def test_the_wheel_carries_the_code_the_configs_and_the_book(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {str(p.relative_to(REPO)) for p in (REPO / "gpt_lit").rglob("*.py")}
    assert sources <= names  # every module and subpackage
    archive = zipfile.ZipFile(wheel)
    for config in (REPO / "configs").glob("*.yaml"):
        assert archive.read(f"gpt_lit/configs/{config.name}") == config.read_bytes()
    assert archive.read("gpt_lit/book/pg35.txt") == (REPO / "gpt_lit/book/pg35.txt").read_bytes()


def test_first_run_from_the_installed_wheel_in_an_empty_folder_offline(wheel, tmp_path):
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
    out = run(*pip, "--target", str(site), str(wheel))
    assert out.returncode == 0, out.stderr[-3000:]
    folder = tmp_path / "reader"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("GPT_LIT_DATA_DIR", "PYTHONPATH")}
    dead = "http://127.0.0.1:9"  # nothing listens there: every download fails at once
    env.update(PYTHONPATH=str(site), http_proxy=dead, https_proxy=dead, HTTP_PROXY=dead, HTTPS_PROXY=dead)
    env.update(no_proxy="", NO_PROXY="", HF_HUB_OFFLINE="1")

    # Where `import gpt_lit` finds it, without running it (which would import torch: seconds of a second process)
    find = "import importlib.util; print(importlib.util.find_spec('gpt_lit').origin)"
    where = run(sys.executable, "-c", find, cwd=folder, env=env)
    assert Path(where.stdout.strip()).is_relative_to(site)  # this wheel, not a checkout or another install

    args = ["fit", "--config", "residual.yaml", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"]
    args += [*TINY, "--data.eval_train", "false"]  # a tiny model: the point is the install, not the training
    fit = run(sys.executable, "-m", "gpt_lit", *args, cwd=folder, env=env)
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert (folder / "lightning_logs/residual/version_0/checkpoints/last.ckpt").is_file()
    output = fit.stdout + fit.stderr
    assert "Trainable params" in output and "loss/val" in output  # the model summary and the losses stay
    assert [word for word in NOISE if word in output] == [], output[-3000:]
