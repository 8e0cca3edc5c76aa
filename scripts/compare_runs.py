"""Draw the chapter's loss figure and print its loss table from the TensorBoard logs of two or more runs.

    python scripts/compare_runs.py lightning_logs/residual lightning_logs/no_residual \
        [lightning_logs/residual_8 lightning_logs/no_residual_8] [--out lightning_logs/chapter_losses.png]

Each argument is a run folder (its newest version_N is read) or a version_N folder. The epoch-end losses on
the whole training and validation sets (``loss/train``, ``loss/val``) become the figure's lines and the
table's rows; ``loss/unigram_baseline`` is the dotted line. Runs of different depths (counted from their
``grad_norm/block_i`` tags) are drawn in panels side by side, each legend below its panel. Runs named like
the chapter's configs (residual, no_residual, residual_8, no_residual_8) print the book's values beside ours.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator  # noqa: E402

EPOCHS = (1, 2, 3, 4, 6, 8, 10)  # the chapter's table columns
BOOK_BASELINE = 6.346  # the chapter's unigram entropy of its copy of the book, nats
_ = None  # the book prints no value there
BOOK_LOSSES = {  # run name -> split -> loss after each epoch of EPOCHS
    "residual": {
        "train": [8.058, 6.619, 6.361, 6.122, 5.602, 5.052, 4.592],
        "val": [8.150, 6.808, 6.580, 6.416, 6.091, 5.831, 5.695],
    },
    "no_residual": {
        "train": [8.225, 6.712, 6.410, 6.408, 6.380, 6.376, 6.369],
        "val": [8.298, 6.889, 6.640, 6.661, 6.683, 6.703, 6.720],
    },
    "residual_8": {"train": [_, _, _, _, _, _, 4.823]},  # 8 blocks: the book gives the final training loss only
    "no_residual_8": {"train": [_, _, _, _, _, _, 6.369]},
}
SPLITS = {"train": "loss/train", "val": "loss/val"}
BASELINE_TAG = "loss/unigram_baseline"


class RunError(Exception):
    """A run folder that cannot be read; the message says which and why."""


def version_dir(path: Path) -> Path:
    """``path`` itself when it holds event files, else its newest ``version_N`` folder that does."""
    if not path.is_dir():
        raise RunError(f"{path} is not a folder: give a run folder such as lightning_logs/residual")
    if any(path.glob("events.out.tfevents.*")):
        return path
    versions = [p for p in path.glob("version_*") if re.fullmatch(r"version_\d+", p.name) and p.is_dir()]
    for v in sorted(versions, key=lambda p: int(p.name.split("_")[1]), reverse=True):
        if any(v.glob("events.out.tfevents.*")):
            return v
    raise RunError(f"{path} has no TensorBoard event files (nor a version_N folder with some): has it been trained?")


def run_name(path: Path) -> str:
    """The run's name: the folder's, or its parent's for a version_N folder."""
    path = path.resolve()
    return path.parent.name if re.fullmatch(r"version_\d+", path.name) else path.name


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in ``folder``'s event files as (step, value), in step order, one value per step."""
    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})  # 0: keep every point
    acc.Reload()
    series = {}
    for tag in acc.Tags()[SCALARS]:
        by_step = {e.step: e.value for e in sorted(acc.Scalars(tag), key=lambda e: e.wall_time)}  # latest wins
        series[tag] = sorted(by_step.items())
    return series


def load_runs(paths: list[Path]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Each run's scalars by its name (a name given twice gets its version folder appended)."""
    runs = {}
    for path in paths:
        folder = version_dir(path)
        scalars = read_scalars(folder)
        if not any(tag in scalars for tag in SPLITS.values()):
            raise RunError(f"{folder} has no epoch losses ({', '.join(SPLITS.values())}): did an epoch finish?")
        name = run_name(path)
        runs[name if name not in runs else f"{name}/{folder.name}"] = scalars
    return runs


def depth(scalars: dict[str, list[tuple[int, float]]]) -> int | None:
    """The run's number of blocks, from its per-block diagnostics (``grad_norm/block_i``), if it logged them."""
    blocks = [int(m.group(1)) for tag in scalars if (m := re.fullmatch(r"grad_norm/block_(\d+)", tag))]
    return max(blocks) if blocks else None


def figure(runs: dict[str, dict[str, list[tuple[int, float]]]]) -> plt.Figure:
    """One panel per depth (the 4-block pair beside the 8-block pair), each with its legend below the axes."""
    panels: dict[int | None, list[str]] = {}
    for name, scalars in runs.items():
        panels.setdefault(depth(scalars), []).append(name)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6.5 * len(panels), 5.2), sharey=True, squeeze=False, layout="constrained"
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (blocks, names) in zip(axes[0], sorted(panels.items(), key=lambda kv: kv[0] or 0), strict=True):
        for i, name in enumerate(names):
            scalars, color = runs[name], colors[i % len(colors)]
            for split, style, label in (("train", "-", "train"), ("val", "--", "validation")):
                points = scalars.get(SPLITS[split], [])
                if points:
                    steps, values = zip(*points, strict=True)
                    ax.plot(steps, values, style, color=color, marker=".", label=f"{name}, {label}")
        baselines = sorted({round(runs[n][BASELINE_TAG][-1][1], 3) for n in names if BASELINE_TAG in runs[n]})
        for value in baselines:
            ax.axhline(value, linestyle=":", color="black", linewidth=1.2, label=f"unigram baseline {value:.3f}")
            ax.annotate(  # at the right, under the line: runs with residuals are far below it by then
                f"unigram baseline {value:.3f}",
                (0.99, value),
                xycoords=("axes fraction", "data"),
                xytext=(0, -12),
                textcoords="offset points",
                horizontalalignment="right",
            )
        ax.set_xlabel("training step")
        ax.set_title(f"{blocks} blocks" if blocks else "loss")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize="small", frameon=False)
    axes[0][0].set_ylabel("loss (nats)")
    fig.suptitle("Loss on the whole training and validation sets, every epoch")
    return fig


def draw(runs: dict[str, dict[str, list[tuple[int, float]]]], out: Path) -> None:
    fig = figure(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def cells(values: list[float | None]) -> str:
    return "".join(f"{v:>8.3f}" if v is not None else f"{'-':>8}" for v in values)


def print_table(runs: dict[str, dict[str, list[tuple[int, float]]]]) -> None:
    width = max(22, *(len(f"{name}, train") + 2 for name in runs))
    print(f"{'Loss after epoch':<{width + 6}}" + "".join(f"{e:>8}" for e in EPOCHS))
    for name, scalars in runs.items():
        for split, tag in SPLITS.items():
            per_epoch = [value for _, value in scalars.get(tag, [])]  # one point per epoch, in order
            if not per_epoch:
                continue
            ours = [per_epoch[e - 1] if e <= len(per_epoch) else None for e in EPOCHS]
            book = BOOK_LOSSES.get(name, {}).get(split)
            label = f"{name}, {split}"
            if book is not None:
                print(f"{label:<{width}}{'book':>6}" + cells(book))
                label = ""
            print(f"{label:<{width}}{'ours':>6}" + cells(ours) + f"   ({len(per_epoch)} epochs)")
    baselines: dict[float, list[str]] = {}
    for name, scalars in runs.items():
        if BASELINE_TAG in scalars:
            baselines.setdefault(round(scalars[BASELINE_TAG][-1][1], 3), []).append(name)
    for value, names in baselines.items():
        print(f"unigram baseline, the dotted line: book {BOOK_BASELINE:.3f} | ours {value:.3f} ({', '.join(names)})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (newest version_N is read) or version folders")
    parser.add_argument("--out", type=Path, default=Path("lightning_logs/chapter_losses.png"), help="the figure")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.runs)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print_table(runs)
    draw(runs, args.out)
    print(f"[figure: {args.out}]")


if __name__ == "__main__":
    main()
