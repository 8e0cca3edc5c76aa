"""The scripts as a reader runs them (their ``main(argv)``, loaded from scripts/ in this process): the book's
values beside ours, real PNG figures."""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import QUIET_TRAINER, chapter_continuation, chapter_experiment, load_script, untrained_gpt2
from lightning.pytorch.loggers import TensorBoardLogger

from gpt_lit.data import TimeMachineData
from gpt_lit.diagnostics import UnigramBaseline
from gpt_lit.model import GPTConfig
from gpt_lit.module import GPTLightning

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_script(capsys, name: str, *args: str, script=None) -> tuple[int, str, str]:
    """`python scripts/<name>.py <args>` (or ``script``, the module loaded already): (exit status, stdout, stderr)."""
    try:
        (script or load_script(name)).main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    height, width, _ = matplotlib.image.imread(path).shape  # decodes the whole image
    assert height > 100 and width > 100


class EpochLosses(L.Callback):
    """What the module computed at each epoch end, to compare with what compare_runs reads back."""

    def __init__(self):
        self.train: list[float] = []
        self.val: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module):  # after the epoch's validation
        self.train.append(float(trainer.callback_metrics["loss/train"]))
        self.val.append(float(trainer.callback_metrics["loss/val"]))


def tiny_run(root: Path, name: str, epochs: int) -> EpochLosses:
    L.seed_everything(123)
    losses = EpochLosses()
    trainer = L.Trainer(
        logger=TensorBoardLogger(root, name=name, default_hp_metric=False),
        callbacks=[UnigramBaseline(), losses],
        max_epochs=epochs,
        log_every_n_steps=1,
        limit_train_batches=2,
        limit_val_batches=1,
        **QUIET_TRAINER,
    )
    model = GPTLightning(GPTConfig(context_length=32, emb_dim=32, n_layers=2, n_heads=2))
    trainer.fit(model, TimeMachineData(context_length=32, stride=128, batch_size=4, eval_batch_size=8))
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    return root, {"residual": tiny_run(root, "residual", 3), "mine": tiny_run(root, "mine", 2)}


def test_compare_runs_prints_the_books_losses_beside_ours_and_draws_the_figure(runs, capsys):
    root, losses = runs
    out = root / "figures" / "losses.png"
    code, stdout, stderr = run_script(
        capsys, "compare_runs", str(root / "residual"), str(root / "mine" / "version_0"), "--out", str(out)
    )
    assert code == 0, stderr
    lines = stdout.splitlines()
    row = lambda label, who: next(line for line in lines if re.match(rf"{label}\s+{who}\s", line))  # noqa: E731
    assert row("residual, train", "book").split()[-7:] == "8.058 6.619 6.361 6.122 5.602 5.052 4.592".split()
    assert "5.695" in row("residual, val", "book")
    # ours follow the book's rows (label only on the book's line); epochs 1-3 of 3, the rest blank
    i = lines.index(row("residual, train", "book"))
    assert lines[i + 1].split()[:4] == ["ours", *(f"{v:.3f}" for v in losses["residual"].train)]
    assert lines[i + 3].split()[:4] == ["ours", *(f"{v:.3f}" for v in losses["residual"].val)]
    # a run the book does not have: ours only, the 2 epochs it has
    assert row("mine, val", "ours").split()[3:5] == [f"{v:.3f}" for v in losses["mine"].val]
    assert not any(line.startswith("mine") and "book" in line for line in lines)
    assert re.search(r"unigram baseline.*book 6\.346 \| ours 6\.350", stdout)
    assert_png(out)


def test_compare_runs_refuses_a_folder_without_logs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path / "missing"):
        code, _, stderr = run_script(capsys, "compare_runs", str(folder), "--out", str(tmp_path / "x.png"))
        assert code == 2
        assert stderr.strip().startswith("error:") and str(folder) in stderr
        assert len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def numbers_after(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(label))
    return line[len(label) :].split()


def test_reproduce_chapter_prints_every_table_with_the_books_values_and_ours(tmp_path, capsys, monkeypatch):
    # the experiments the other tests check, made once per session: this test checks what the script prints
    ex = load_script("reproduce_chapter")
    monkeypatch.setattr(ex, "residual_experiment", chapter_experiment)
    monkeypatch.setattr(ex, "untrained_gpt2", untrained_gpt2)
    monkeypatch.setattr(ex, "continuation", chapter_continuation)
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # the figure the script saves, kept to read its lines
    code, out, stderr = run_script(capsys, "reproduce_chapter", "--out", str(tmp_path), script=ex)
    assert code == 0, stderr
    # each table: the book's value and ours side by side
    assert "-1.3416  -0.4472   0.4472   1.3416 |  -1.3416  -0.4472   0.4472   1.3416" in out
    assert re.search(r"-0\.5\s*\|\s*0\.0000\s+0\.0000\s*\|\s*-0\.1543\s+-0\.1543", out)
    book_row = "0.91 0.65 0.52 0.45 0.40 0.35 0.31 0.32 0.29 0.27 0.26 0.25".split()
    assert numbers_after(out, "With residuals, book") == book_row
    assert numbers_after(out, "With residuals, ours") == book_row
    assert numbers_after(out, "Without, book") == "1.22 1.15 1.19 1.24 1.33 1.42 1.38 1.31 1.24 1.17 0.99 1.03".split()
    assert len(numbers_after(out, "Without, ours")) == 12
    assert re.search(r"^12\s+0\.563 \| 0\.563\s+1\.000 \| 1\.000$", out, re.MULTILINE)  # similarity
    assert re.search(r"^48\s+0\.731 \| 0\.731\s+1\.000 \| 1\.000$", out, re.MULTILINE)
    for part, _, book in ex.BOOK_PARAMETERS:
        assert re.search(rf"{re.escape(part)}.*{book:,} \|\s+{book:,}\n", out), part
    assert re.search(r"tie_weights=True\s+124,439,808 \|\s+124,439,808", out)
    assert re.search(r"bytes.*497,759,232 \|\s+497,759,232", out)
    for book in ex.BOOK_CONTINUATIONS.values():
        assert f"book: {book}\nours: {book}\n" in out
    assert re.search(r"most likely token.*0\.000166 \| 0\.000166", out)
    assert re.search(r"entropy of the distribution, nats\s+10\.67 \| 10\.67", out)
    assert_png(tmp_path / "gelu_relu.png")
    # the figure's lines: GELU's tanh form and ReLU, written out, at 61 points from -3 to 3
    [fig] = figures
    gelu_line, relu_line = fig.axes[0].get_lines()
    x = np.linspace(-3, 3, 61)
    assert gelu_line.get_xdata() == pytest.approx(x, abs=1e-6)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    assert gelu_line.get_ydata() == pytest.approx(gelu, abs=1e-5)
    assert relu_line.get_ydata() == pytest.approx(np.maximum(x, 0), abs=1e-6)
