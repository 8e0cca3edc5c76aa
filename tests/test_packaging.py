"""A reader's first run from the wheel: `pip install .` (not editable), then, in an empty folder with no network,
`python -m gpt_lit fit --config residual.yaml` (with a tiny model), in a terminal (a pseudo-terminal, so the rich
progress bar draws itself live, as a reader sees it), trains on the shipped book and prints no noise, each line
whole.

Both steps start processes on purpose: pip, and `python -m gpt_lit` from the installed wheel, as a reader runs it.
In the ``full`` tier (GPT_LIT_TESTS=full, as CI runs it); by default tests/test_readme.py runs the README's commands
from the checkout, each a process of its own, and checks their output for NOISE."""

import fcntl
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, TINY

pytestmark = pytest.mark.full

NOISE = ["Tip:", "litlogger", "already configured", "LeafSpec", "deprecated", "weights_only", "FLOPs", "Warning"]


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=900, **kw)


def run_in_terminal(*args: str, columns: int = 160, **kw) -> tuple[int, str]:
    """``args`` with stdout and stderr on a pseudo-terminal ``columns`` wide: the exit status, and what a terminal
    was sent, escape sequences and all."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=child, stderr=child, **kw)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return proc.wait(timeout=900), b"".join(chunks).decode(errors="replace")


def terminal_lines(sent: str) -> list[str]:
    """What ``sent`` puts at the start of each line of the terminal, roughly: without escape sequences (colours,
    cursor moves), split at line ends and carriage returns."""
    return re.split(r"\r\n|\r|\n", re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", sent))


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


def test_the_wheel_carries_the_code_the_configs_the_book_and_the_page(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {str(p.relative_to(REPO)) for p in (REPO / "gpt_lit").rglob("*.py")}
    assert sources <= names  # every module and subpackage
    archive = zipfile.ZipFile(wheel)
    for config in (REPO / "configs").glob("*.yaml"):
        assert archive.read(f"gpt_lit/configs/{config.name}") == config.read_bytes()
    for data in ("book/pg35.txt", "inspect_page.html"):  # the book, and the template of predict's inspect page
        assert archive.read(f"gpt_lit/{data}") == (REPO / "gpt_lit" / data).read_bytes()


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
    code, output = run_in_terminal(sys.executable, "-m", "gpt_lit", *args, cwd=folder, env=env)
    assert code == 0, output[-3000:]
    assert (folder / "lightning_logs/residual/version_0/checkpoints/last.ckpt").is_file()
    assert "Trainable params" in output and "loss/val" in output  # the model summary and the losses stay
    assert [word for word in NOISE if word in output] == [], output[-3000:]
    # Lightning's last line starts a line of its own, above the bar, not glued to the bar's last line
    assert "`Trainer.fit` stopped: `max_epochs=1` reached." in terminal_lines(output), output[-3000:]
