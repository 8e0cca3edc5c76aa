"""scripts/compare_runs.py's figure for the chapter's four runs: the 4-block and 8-block pairs side by side."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_script
from torch.utils.tensorboard import SummaryWriter

# Whole-set losses per epoch shaped like the chapter's 10-epoch runs (rounded from ours): with residuals the
# training loss crosses the floor at epoch 3, without it settles just above it.
CURVES = {
    "residual": (
        [8.04, 6.61, 6.32, 6.11, 5.89, 5.64, 5.35, 5.10, 4.86, 4.65],
        [8.15, 6.82, 6.59, 6.44, 6.30, 6.15, 6.00, 5.90, 5.82, 5.76],
    ),
    "no_residual": (
        [8.17, 6.69, 6.41, 6.40, 6.39, 6.38, 6.37, 6.37, 6.37, 6.36],
        [8.26, 6.89, 6.67, 6.69, 6.70, 6.72, 6.72, 6.74, 6.75, 6.76],
    ),
}


def write_run(folder, n_layers: int, curves: tuple[list[float], list[float]]) -> None:
    """An event file like a run's: per-block gradient norms, 10 epochs of whole-set losses, the floor."""
    with SummaryWriter(folder) as w:
        for step in range(10 * 19):
            w.add_scalar("loss/unigram_baseline", 6.35, step)
            for i in range(1, n_layers + 1):
                w.add_scalar(f"grad_norm/block_{i}", 0.5, step)
        for epoch, (train, val) in enumerate(zip(*curves, strict=True)):
            step = 19 * epoch + 18
            w.add_scalar("loss/train", train, step)
            w.add_scalar("loss/val", val, step)


def points_on(line, n: int = 40) -> np.ndarray:
    """Points along a drawn line (its vertices and n between each pair), in display coordinates."""
    xy = line.get_xydata()
    between = [a + (b - a) * t for a, b in zip(xy[:-1], xy[1:], strict=True) for t in np.linspace(0, 1, n)]
    return line.axes.transData.transform(np.array(between))


def test_one_panel_per_depth_and_every_legend_off_the_data(tmp_path):
    script = load_script("compare_runs")
    names = ["residual", "no_residual", "residual_8", "no_residual_8"]
    for name in names:
        write_run(tmp_path / name / "version_0", 8 if name.endswith("_8") else 4, CURVES[name.removesuffix("_8")])
    runs = script.load_runs([tmp_path / name for name in names])
    fig = script.figure(runs)
    fig.canvas.draw()
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert list(panels) == ["4 blocks", "8 blocks"]
    for title, names in (("4 blocks", ["residual", "no_residual"]), ("8 blocks", ["residual_8", "no_residual_8"])):
        ax = panels[title]
        labels = [line.get_label() for line in ax.get_lines()]
        assert [x for x in labels if not x.startswith("unigram")] == [
            f"{n}, {split}" for n in names for split in ("train", "validation")
        ]
        # each line draws its run's losses at the epochs' last steps: validation the validation loss, not training's
        lines = {line.get_label(): line for line in ax.get_lines()}
        for n in names:
            train, val = CURVES[n.removesuffix("_8")]
            steps = [19 * epoch + 18 for epoch in range(10)]
            assert list(lines[f"{n}, train"].get_xdata()) == steps
            assert list(lines[f"{n}, train"].get_ydata()) == pytest.approx(train)
            assert list(lines[f"{n}, validation"].get_xdata()) == steps
            assert list(lines[f"{n}, validation"].get_ydata()) == pytest.approx(val)
        # no_residual's lines are not drawn under no_residual_8's any more: each pair has its own axes
        assert len({line.get_color() for line in ax.get_lines() if not line.get_label().startswith("unigram")}) == 2
        legend, renderer = ax.get_legend(), fig.canvas.get_renderer()
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))  # below the axes
        # the floor's label is written where no loss line runs (the runs cross the floor near the start)
        (label,) = [text for text in ax.texts if text.get_text() == "unigram baseline 6.350"]
        box = label.get_window_extent(renderer)
        for line in ax.get_lines():
            if not line.get_label().startswith("unigram"):
                assert not box.count_contains(points_on(line)), f"{line.get_label()} runs through the floor's label"
