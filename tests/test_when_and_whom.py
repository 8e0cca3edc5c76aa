"""The instruments under any Lightning setting: after each validation Lightning runs, at its step, in every logger.

Tiny fits of residual.yaml (its every instrument; no checkpoints) under ordinary Lightning settings, each with a set
of loggers, every setting and every kind of logger at least once (pairwise: the settings are one factor, the
loggers the other). For each run, in each logger: every per-validation tag (loss by position, lens, residual
stream, attention entropy, similarity, ``loss/val_best``, the unigram floor; the figures, attention maps and
samples in TensorBoard) is at the steps of ``loss/val``, and ``loss/val`` at the steps at which the setting makes
Lightning validate (counted by hand below); what is logged there is that validation's: the loss by position
averages to its ``loss/val``, the loss figure's points are its losses, ``loss/val_best`` the lowest so far; no
value from a sanity check; the figures draw one line per validation, named by it; the loggers hold the same values.
"""

from __future__ import annotations

import csv
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TINY
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, TENSORS, EventAccumulator
from tensorboard.plugins.hparams import metadata as hp_metadata

from gpt_lit.diagnostics import ChapterFigures, LogitLens, PositionLoss
from gpt_lit.measure import lens_losses, record_blocks
from gpt_lit.run.cli import main

RUN = [
    *TINY, "--data.eval_batch_size", "8", "--data.eval_train", "false", "--trainer.limit_val_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    "--trainer.enable_checkpointing", "false",
]  # fmt: skip

# setting: (its options, the steps of loss/val: where Lightning validates under it, by hand)
SETTINGS = {
    # 2 epochs of 2 steps: each epoch's end, at its last step's index
    "shipped": ("--trainer.max_epochs 2 --trainer.limit_train_batches 2", [1, 3]),
    # 4 batches an epoch, validation every 2nd: after batches 1 and 3 of each epoch
    "val_check_interval_0.5": (
        "--trainer.max_epochs 2 --trainer.limit_train_batches 4 --trainer.val_check_interval 0.5",
        [1, 3, 5, 7],
    ),
    # a sanity check, then validation after epoch 1 only (epochs 0 and 2 have none); the training set evaluated too
    "every_2nd_epoch_with_sanity_check": (
        "--trainer.max_epochs 3 --trainer.limit_train_batches 2 --trainer.check_val_every_n_epoch 2 "
        "--trainer.num_sanity_val_steps 1 --data.eval_train true",
        [3],
    ),
    # every 4 batches counted across epochs of 6: batches 3, 7 (epoch 1's second) and 11
    "every_4_steps_across_epochs": (
        "--trainer.max_epochs 2 --trainer.limit_train_batches 6 --trainer.check_val_every_n_epoch null "
        "--trainer.val_check_interval 4",
        [3, 7, 11],
    ),
    # 6 batches, 3 optimizer steps, validation every 3rd batch: after batch 2, which only accumulates (one step
    # before it), and after batch 5, which steps (two steps before it)
    "accumulate_2": (
        "--trainer.max_epochs 1 --trainer.limit_train_batches 6 --trainer.accumulate_grad_batches 2 "
        "--trainer.val_check_interval 3",
        [1, 2],
    ),
    # a time-based interval of 0 seconds: after every batch
    "time_based_interval": (
        "--trainer.max_epochs 1 --trainer.limit_train_batches 2 --trainer.val_check_interval 00:00:00:00",
        [0, 1],
    ),
    # no validation at all
    "no_validation": ("--trainer.max_epochs 2 --trainer.limit_train_batches 2 --trainer.limit_val_batches 0", []),
}
LOGGERS = {
    "tensorboard": ["tensorboard"],
    "tensorboard_and_csv": ["tensorboard", "csv"],
    "csv_first": ["csv", "tensorboard"],
    "none": [],
}
CASES = [
    ("shipped", "tensorboard"),
    ("val_check_interval_0.5", "csv_first"),
    ("every_2nd_epoch_with_sanity_check", "tensorboard_and_csv"),
    ("every_4_steps_across_epochs", "csv_first"),
    ("accumulate_2", "tensorboard_and_csv"),
    ("time_based_interval", "tensorboard_and_csv"),
    ("no_validation", "tensorboard"),
    ("every_2nd_epoch_with_sanity_check", "none"),
]
assert {s for s, _ in CASES} == set(SETTINGS) and {lg for _, lg in CASES} == set(LOGGERS)

# The scalars logged after each validation; those also logged at the start of a fresh run (step 0).
PER_VALIDATION = ["loss_by_position/", "lens/", "loss/val_best"]
ALSO_AT_START = ["similarity/", "stream/", "attention/entropy/", "loss/unigram_baseline"]
N_LAYERS = 2


def logger_config(kind: str, folder: Path) -> dict:
    if kind == "tensorboard":
        init = {"save_dir": str(folder), "name": "tb", "default_hp_metric": False}
        return {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": init}
    return {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(folder), "name": "csv"}}


@dataclass
class Run:
    setting: str
    loggers: str
    trainer: object
    module: object
    data: object
    val_steps: list[int]  # where Lightning validates under the setting, by hand
    scalars: list[tuple[str, dict[str, list[tuple[int, float]]]]]  # each logger's: (its kind, tag -> [(step, value)])
    events: list[EventAccumulator]  # each TensorBoard logger's


# By default one case: validations mid-epoch and at an epoch's end, counted across epochs, with the CSV logger first.
# The others (a sanity check and validation every 2nd epoch among them): the ``full`` tier.
DEFAULT = [("every_4_steps_across_epochs", "csv_first")]
assert set(DEFAULT) <= set(CASES)
PARAMS = [pytest.param(case, id="-".join(case), marks=[] if case in DEFAULT else [pytest.mark.full]) for case in CASES]


@pytest.fixture(scope="module", params=PARAMS)
def run(request, tmp_path_factory) -> Iterator[Run]:
    setting, loggers = request.param
    folder = tmp_path_factory.mktemp(f"{setting}-{loggers}")
    config = (REPO / "configs/residual.yaml").read_text()
    config = config[: config.index("    - class_path: lightning.pytorch.callbacks.ModelCheckpoint")]
    config = config.replace("max_new_tokens: 30", "max_new_tokens: 4")  # the samples: what matters is when
    (folder / "residual.yaml").write_text(config)
    kinds = [logger_config(kind, folder) for kind in LOGGERS[loggers]]
    options, val_steps = SETTINGS[setting]
    logger = ["--trainer.logger", json.dumps(kinds) if kinds else "false"]
    where = ["--trainer.default_root_dir", str(folder)]  # without a logger, the run's config.yaml goes there
    cli = main(["fit", "--config", str(folder / "residual.yaml"), *RUN, *options.split(), *logger, *where])
    assert cli.trainer.state.finished
    events = [tensorboard_events(lg) for lg in cli.trainer.loggers if isinstance(lg, TensorBoardLogger)]
    yield Run(setting, loggers, cli.trainer, cli.model, cli.datamodule, val_steps, logged(cli.trainer), events)
    del cli
    gc.collect()  # the run's trainer, model and optimizer (cycles among Lightning's objects) before the next run


def csv_scalars(logger: CSVLogger) -> dict[str, list[tuple[int, float]]]:
    """Every value of metrics.csv, as (step, value) lists per column."""
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for tag, value in row.items():
            if tag != "step" and value != "":
                out.setdefault(tag, []).append((int(row["step"]), float(value)))
    return out


def tensorboard_events(logger: TensorBoardLogger) -> EventAccumulator:
    events = EventAccumulator(logger.log_dir, size_guidance={SCALARS: 0, TENSORS: 0, IMAGES: 0})
    events.Reload()
    return events


def logged(trainer) -> list[tuple[str, dict[str, list[tuple[int, float]]]]]:
    """Each logger's scalars: (its kind, tag -> [(step, value)])."""
    out = []
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            out.append(("csv", csv_scalars(logger)))
        else:
            events = tensorboard_events(logger)
            out.append(
                ("tensorboard", {t: [(e.step, e.value) for e in events.Scalars(t)] for t in events.Tags()[SCALARS]})
            )
    return out


def steps(points: list[tuple[int, float]]) -> list[int]:
    return [s for s, _ in points]


def test_loss_val_is_logged_where_the_setting_makes_lightning_validate(run):
    assert [kind for kind, _ in run.scalars] == LOGGERS[run.loggers]
    for kind, scalars in run.scalars:
        assert steps(scalars.get("loss/val", [])) == run.val_steps, kind


def test_every_instruments_scalars_are_at_the_validations_steps_in_every_logger(run):
    for kind, scalars in run.scalars:
        val = run.val_steps
        for prefix in PER_VALIDATION + ALSO_AT_START:
            tags = [tag for tag in scalars if tag.startswith(prefix)]
            assert tags or (not val and prefix in PER_VALIDATION), (kind, prefix)  # every instrument, every logger
            start = [0] if prefix in ALSO_AT_START else []
            for tag in tags:
                assert steps(scalars[tag]) == start + val, (kind, tag)


def test_images_and_text_are_at_the_validations_steps_in_every_tensorboard_logger(run):
    for events in run.events:
        images = events.Tags()[IMAGES]
        at_start = {"figures/stream_by_block", *(f"attention/block_{i}" for i in range(1, N_LAYERS + 1))}
        figures = {f"figures/{name}" for name in ("losses", "grad_norm_by_block", "similarity_by_block",
                                                   "loss_by_position", "lens_by_block")}  # fmt: skip
        assert set(images) == (figures if run.val_steps else set()) | at_start
        for tag in images:
            assert [e.step for e in events.Images(tag)] == ([0] if tag in at_start else []) + run.val_steps, tag
        for prompt in ("The Time Traveller", "I saw"):
            assert [e.step for e in events.Tensors(f"samples/{prompt}/text_summary")] == [0, *run.val_steps]


def test_the_runs_settings_go_to_every_logger(run):
    """The runs table's row in every TensorBoard logger's HParams tab; the same settings in every other logger's
    hyperparameters (CSV: hparams.yaml)."""
    for events in run.events:
        tags = events.PluginTagToContent(hp_metadata.PLUGIN_NAME)
        start = hp_metadata.parse_session_start_info_plugin_data(tags[hp_metadata.SESSION_START_INFO_TAG])
        assert start.hparams["n_layers"].number_value == N_LAYERS and start.hparams["residual"].bool_value
    for logger in run.trainer.loggers:
        if isinstance(logger, CSVLogger):
            hparams = yaml.safe_load((Path(logger.log_dir) / "hparams.yaml").read_text())
            assert hparams["n_layers"] == N_LAYERS and hparams["residual"] is True and hparams["seed_everything"] == 123


def test_each_validations_instruments_hold_that_validations_values(run):
    """No sanity check's values, no values kept from an earlier validation: the loss by position of each validation
    averages (over positions: every window has each) to that validation's loss/val, the loss figure's points are each
    validation's losses, loss/val_best is the lowest loss/val so far; and the loggers agree."""
    if not run.trainer.loggers:
        return
    kind, scalars = run.scalars[0]
    val = scalars.get("loss/val", [])
    [positions] = [cb for cb in run.trainer.callbacks if isinstance(cb, PositionLoss)]
    assert [(p["step"], sum(p["losses"]) / len(p["losses"])) for p in positions.history] == [
        (s, pytest.approx(v, abs=1e-5)) for s, v in val
    ]
    [figures] = [cb for cb in run.trainer.callbacks if isinstance(cb, ChapterFigures)]
    assert [(p["step"], p["val"]) for p in figures.history] == [(s, pytest.approx(v, abs=1e-6)) for s, v in val]
    train = scalars.get("loss/train", [])
    assert [(p["step"], p["train"]) for p in figures.history if p["train"] is not None] == [
        (s, pytest.approx(v, abs=1e-6)) for s, v in train
    ]
    assert steps(train) == (run.val_steps if "--data.eval_train true" in SETTINGS[run.setting][0] else [])
    best = [min(v for _, v in val[: i + 1]) for i in range(len(val))]
    assert [v for _, v in scalars.get("loss/val_best", [])] == pytest.approx(best, abs=1e-6)
    for other_kind, other in run.scalars[1:]:  # every logger got the same values
        for tag, points in scalars.items():
            if tag.startswith(tuple(PER_VALIDATION + ALSO_AT_START)) or tag in ("loss/val", "loss/train"):
                assert steps(other[tag]) == steps(points), (other_kind, tag)
                assert [v for _, v in other[tag]] == pytest.approx([v for _, v in points], rel=1e-6), (other_kind, tag)


def test_the_last_validations_lens_is_the_model_at_that_validation(run):
    """Where the last validation closes the run (its last step), its lens values are the final model's."""
    if not run.trainer.loggers or not run.val_steps or run.val_steps[-1] != run.trainer.global_step - 1:
        return
    _, scalars = run.scalars[0]
    [lens] = [cb for cb in run.trainer.callbacks if isinstance(cb, LogitLens)]
    model = run.module.model.eval()
    x, y = lens.inputs, lens.targets  # the probe's fixed validation windows
    expected = lens_losses(model, record_blocks(model, x), y).flatten(1).mean(dim=1).tolist()
    got = [scalars[f"lens/block_{i}"][-1] for i in range(1, N_LAYERS + 1)]
    assert got == [(run.val_steps[-1], pytest.approx(v, abs=1e-5)) for v in expected]


def test_the_figures_draw_one_line_per_validation_named_by_it(run):
    if not any(isinstance(logger, TensorBoardLogger) for logger in run.trainer.loggers):
        return
    [positions] = [cb for cb in run.trainer.callbacks if isinstance(cb, PositionLoss)]
    if not run.val_steps:
        assert positions.history == []
        return
    ax = positions.chart.fig.axes[0]
    names = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith(("_", "unigram"))]
    expected = {
        "shipped": ["epoch 0", "epoch 1"],
        "val_check_interval_0.5": ["epoch 0, step 1", "epoch 0", "epoch 1, step 5", "epoch 1"],
        "every_2nd_epoch_with_sanity_check": ["epoch 1"],
        "every_4_steps_across_epochs": ["epoch 0, step 3", "epoch 1, step 7", "epoch 1"],
        "accumulate_2": ["epoch 0, step 1", "epoch 0"],
        "time_based_interval": ["epoch 0, step 0", "epoch 0"],
    }
    assert names == expected[run.setting]
