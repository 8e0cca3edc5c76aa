"""scripts/compare_runs.py's figure for the chapter's four runs: the 4-block and 8-block pairs side by side."""

from __future__ import annotations

import importlib.util
import math

from conftest import REPO
from torch.utils.tensorboard import SummaryWriter


def load_script():
    spec = importlib.util.spec_from_file_location("compare_runs", REPO / "scripts" / "compare_runs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def write_run(folder, n_layers: int, final: float) -> None:
    """An event file like a run's: per-block gradient norms, 3 epochs of whole-set losses, the floor."""
    with SummaryWriter(folder) as w:
        for step in range(3 * 19):
            w.add_scalar("loss/unigram_baseline", 6.35, step)
            for i in range(1, n_layers + 1):
                w.add_scalar(f"grad_norm/block_{i}", 0.5, step)
        for epoch in range(3):
            step = 19 * epoch + 18
            w.add_scalar("loss/train", final + math.exp(-epoch), step)
            w.add_scalar("loss/val", final + 0.1 + math.exp(-epoch), step)


def test_one_panel_per_depth_and_every_legend_off_the_data(tmp_path):
    script = load_script()
    finals = {"residual": 4.6, "no_residual": 6.36, "residual_8": 4.62, "no_residual_8": 6.36}
    for name, final in finals.items():
        write_run(tmp_path / name / "version_0", 8 if name.endswith("_8") else 4, final)
    runs = script.load_runs([tmp_path / name for name in finals])
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
        # no_residual's lines are not drawn under no_residual_8's any more: each pair has its own axes
        assert len({line.get_color() for line in ax.get_lines() if not line.get_label().startswith("unigram")}) == 2
        legend, renderer = ax.get_legend(), fig.canvas.get_renderer()
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))  # below the axes
