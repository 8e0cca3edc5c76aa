"""The smoke path a reader takes, on a tiny model: fit two steps, resume, test, predict; and the screen it shows.

It runs in the full suite like every other test; CI runs it again, alone (``python -m pytest -m smoke``), in an
environment with the lowest version of every dependency pyproject.toml allows (.ci/lowest), so that each lower
bound has really run the same assertions.
"""

from pathlib import Path

import pytest
import torch
from conftest import TINY
from lightning.pytorch.callbacks.progress.progress_bar import get_standard_metrics
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gpt_lit.run.cli import main

pytestmark = pytest.mark.smoke

STEPS = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
RUN = ["--config", "residual", *TINY, "--trainer.accelerator", "cpu", *STEPS]


def event_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("events.out.tfevents.*"))


def scalar_steps(run: Path, tag: str) -> list[int]:
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def test_fit_resume_test_predict(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "lightning_logs" / "residual"
    run = runs / "version_0"

    # fit: one epoch of two steps, with the progress bar on (the config's default)
    cli = main(["fit", *RUN, "--trainer.max_epochs", "1"])
    assert cli.trainer.global_step == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best-epoch00.ckpt", "last.ckpt"]
    bar = cli.trainer.progress_bar_callback
    assert bar is not None and "v_num" in get_standard_metrics(cli.trainer)  # Lightning would show the version
    shown = bar.get_metrics(cli.trainer, cli.model)
    assert "v_num" not in shown and "loss/train_step" in shown  # the bar shows the losses, not the version

    # resume from last.ckpt into the same run: two more steps, every step logged once
    cli = main(["fit", *RUN, "--trainer.max_epochs", "2", "--ckpt_path", "last",
                "--trainer.logger.init_args.version", "0"])  # fmt: skip
    assert cli.trainer.global_step == 4 and cli.trainer.current_epoch == 2
    assert scalar_steps(run, "loss/train_step") == [0, 1, 2, 3]

    # test the latest run's last checkpoint, without a progress bar: the loss goes beside the run
    cli = main(["test", *RUN, "--ckpt_path", "last", "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.progress_bar_callback is None
    loss = cli.trainer.callback_metrics["test/loss"]
    assert torch.isfinite(loss) and 0 < loss < 11  # below ln(50257) = 10.8: the trained weights, not random ones
    assert len(scalar_steps(run / "test" / "last", "test/loss")) == 1

    # predict from the same checkpoint: continuations.txt beside the run, and no TensorBoard run for it
    capsys.readouterr()
    main(["predict", *RUN, "--ckpt_path", "last", "--data.prompts", '["I saw"]', "--model.max_new_tokens", "3"])
    written = run / "predict" / "last" / "continuations.txt"
    assert written.read_text().startswith("I saw") and "I saw" in capsys.readouterr().out
    assert event_files(run / "predict") == []

    # predict without a checkpoint: the next run folder keeps the file, and again no TensorBoard run
    main(["predict", *RUN, "--data.prompts", '["I saw"]', "--model.max_new_tokens", "3"])
    assert (runs / "version_1" / "continuations.txt").read_text().startswith("I saw")
    assert event_files(runs / "version_1") == []
    assert sorted(p.name for p in runs.iterdir()) == ["version_0", "version_1"]
    assert {f.parent.relative_to(run) for f in event_files(run)} == {Path("."), Path("test/last")}
