"""PositionLoss without a training run: its figure's content, the scalars and images it logs after a validation, what a
checkpoint keeps of it, its unigram floor. Each value is checked against one computed here by hand; in milliseconds,
so that mutation testing (docs/testing.md) runs these for every mutant of gpt_lit/diagnostics/position_loss.py."""

import io
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

N = 20  # positions of the hand-made loss vectors


def losses(shift: float) -> list[float]:
    """Falling with the position, as float32 values (what the callback receives)."""
    return torch.tensor([5.0 - math.log(p) / 2 + shift for p in range(1, N + 1)]).tolist()


OCTAVES = [(1, 1), (2, 3), (4, 7), (8, 20)]  # 8-15 and a short 16-20 are one octave


def by_hand(values: list[float]) -> tuple[list[float], list[float]]:
    centres = [math.sqrt(lo * hi) for lo, hi in OCTAVES]
    means = [sum(values[lo - 1 : hi]) / (hi - lo + 1) for lo, hi in OCTAVES]
    return centres, means


def test_the_figure_shows_each_validations_positions_faint_its_octaves_bold_and_the_floor():
    from gpt_lit.diagnostics.figures import epoch_colour

    history = [{"step": 4, "epoch": 1, "losses": losses(0.5)}, {"step": 8, "epoch": 2, "losses": losses(0.0)}]
    fig = position_figure(history, 4.25, last=3)
    ax = fig.axes[0]
    *drawn, floor = ax.lines
    assert len(drawn) == 4  # per validation: its positions, then its octaves
    for i, point in enumerate(history):
        faint, bold = drawn[2 * i : 2 * i + 2]
        assert list(faint.get_xdata()) == list(range(1, N + 1))
        assert faint.get_ydata() == pytest.approx(point["losses"])
        assert faint.get_alpha() < 1 and faint.get_linewidth() < bold.get_linewidth()
        centres, means = by_hand(point["losses"])
        assert bold.get_xdata() == pytest.approx(centres) and bold.get_ydata() == pytest.approx(means)
        assert bold.get_marker() == "o" and bold.get_markersize() == 4
        assert faint.get_color() == bold.get_color() == epoch_colour(point["epoch"], 3)  # on the run's 3 epochs' scale
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["0", "1", "2"]  # the colour bar: epochs 0-2
    assert list(floor.get_ydata()) == [4.25, 4.25] and floor.get_linestyle() == ":"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["unigram floor 4.250"]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert list(ax.get_xticks()) == [1, 2, 4, 8, 16] and ax.get_xlim() == (1, N)
    assert [ax.xaxis.get_major_formatter()(v, 0) for v in (1, 16)] == ["1", "16"]
    assert len(ax.xaxis.get_minorticklocs()) == 0
    assert ax.get_title() == "Validation loss at each position (faint) and per octave of positions"
    assert ax.get_xlabel() == "position: tokens of context seen (log scale)"
    assert ax.get_ylabel() == "validation loss (nats)"
    long = position_figure([{"step": 1, "epoch": 1, "losses": [1.0] * 1024}], None, None).axes[0]
    assert list(long.get_xticks()) == [2**k for k in range(11)]  # every power of 2 up to the context length


def test_octave_means_of_one_and_of_three_positions():
    from gpt_lit.measure import octave_means

    assert octave_means([2.0]) == ([1.0], [2.0])
    centres, means = octave_means([2.0, 4.0, 9.0, 5.0])  # 1, then 2-4: a fourth position makes no octave alone
    assert centres == pytest.approx([1.0, math.sqrt(8)]) and means == pytest.approx([2.0, 6.0])
    assert octave_means([]) == ([], [])


def position_figure(history, floor, last):
    from gpt_lit.diagnostics.figures import Chart, draw_positions

    draw_positions((chart := Chart()).axes(), history, floor, last)
    return chart.fig


def tensorboard_trainer(tmp_path, datamodule=None):
    """What the callback reads of a Trainer in fit, with a TensorBoard logger."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning.pytorch.trainer.states import TrainerFn

    logger = TensorBoardLogger(str(tmp_path), name="run", version=0)
    trainer = SimpleNamespace(loggers=[logger], is_global_zero=True, sanity_checking=False, max_epochs=3,
                              state=SimpleNamespace(fn=TrainerFn.FITTING), datamodule=datamodule)  # fmt: skip
    return trainer, logger


def events(logger) -> EventAccumulator:
    logger.experiment.flush()
    acc = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return acc


def image(acc: EventAccumulator, tag: str) -> list[tuple[int, np.ndarray]]:
    return [(e.step, np.asarray(Image.open(io.BytesIO(e.encoded_image_string)))) for e in acc.Images(tag)]


def validated(callback, trainer, step: int, epoch: float, values: list[float] | None) -> dict[str, float]:
    """One validation as Lightning runs it for the callback: its start, the validation step's per-token losses of
    one sequence (``values``; None: no batch of the validation set), then its end at ``step``, after ``epoch``
    epochs. Returns the scalars the callback logged with ``pl_module.log_dict``."""
    logged = {}
    module = SimpleNamespace(model=SimpleNamespace(cfg=SimpleNamespace(context_length=N)), device=torch.device("cpu"),
                             log_dict=lambda metrics, **_: logged.update(metrics))  # fmt: skip
    callback.on_validation_start(trainer, module)
    if values is not None:
        callback.on_validation_batch_end(trainer, module, {"token_losses": torch.tensor([values])}, None, 0)
    callback.step, callback.epoch = step, epoch  # as the callback read them when the validation's batch started
    callback.on_validation_epoch_end(trainer, module)
    return logged


def drawing(history, floor=None, last=3) -> np.ndarray:
    from conftest import figure_pixels

    return figure_pixels(position_figure(history, floor, last))


def test_after_a_validation_each_chosen_positions_loss_and_the_figure_reach_tensorboard(tmp_path):
    from gpt_lit.diagnostics.position_loss import PositionLoss

    trainer, logger = tensorboard_trainer(tmp_path)
    callback = PositionLoss(positions=[0, 1, 4, N, N + 1])  # 0 and N + 1: no such position
    first, second = losses(0.5), losses(0.0)
    logged = [validated(callback, trainer, 5, 1.0, first)]
    assert validated(callback, trainer, 9, 1.5, None) == {}  # no per-position losses: nothing logged
    logged.append(validated(callback, trainer, 11, 2.0, second))
    for scalars, values in zip(logged, (first, second), strict=True):
        assert scalars == {f"loss_by_position/{p}": pytest.approx(values[p - 1]) for p in (1, 4, N)}
    history = [{"step": 5, "epoch": 1.0, "losses": first}, {"step": 11, "epoch": 2.0, "losses": second}]
    images = image(events(logger), "figures/loss_by_position")
    assert [step for step, _ in images] == [5, 11]
    assert np.array_equal(images[0][1], drawing(history[:1]))
    assert np.array_equal(images[1][1], drawing(history))
    assert callback.state_dict() == {"history": history}  # what a checkpoint keeps
    quiet, (no_logger, _) = PositionLoss(), tensorboard_trainer(tmp_path / "quiet")
    no_logger.loggers = []
    assert validated(quiet, no_logger, 5, 1.0, first) == {}
    assert quiet.state_dict() == {"history": []}  # a run without a logger keeps nothing to draw


def test_a_resumed_runs_figure_keeps_the_validations_before_the_checkpoint(tmp_path):
    from gpt_lit.diagnostics.position_loss import PositionLoss

    earlier = [{"step": 5, "epoch": 1.0, "losses": losses(0.5)}]
    callback = PositionLoss()
    callback.load_state_dict({"history": earlier})
    trainer, logger = tensorboard_trainer(tmp_path)
    validated(callback, trainer, 11, 2.0, losses(0.0))
    [(step, pixels)] = image(events(logger), "figures/loss_by_position")
    assert step == 11
    assert np.array_equal(pixels, drawing([*earlier, {"step": 11, "epoch": 2.0, "losses": losses(0.0)}]))
    fresh = PositionLoss()
    fresh.load_state_dict({})  # a checkpoint saved without this callback
    assert fresh.state_dict() == {"history": []}


def test_the_figure_draws_the_data_modules_unigram_floor_and_none_without_one(tmp_path):
    from gpt_lit.diagnostics.position_loss import PositionLoss

    for datamodule, floor in ((SimpleNamespace(unigram_floor=4.25), 4.25), (SimpleNamespace(), None), (None, None)):
        callback = PositionLoss()
        trainer, logger = tensorboard_trainer(tmp_path / str(len(str(datamodule))), datamodule)
        validated(callback, trainer, 3, 1.0, losses(0.0))
        [(_, pixels)] = image(events(logger), "figures/loss_by_position")
        expected = drawing([{"step": 3, "epoch": 1.0, "losses": losses(0.0)}], floor=floor)
        assert np.array_equal(pixels, expected), floor
