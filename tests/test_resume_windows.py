"""A run stopped mid-epoch and resumed trains on the windows the uninterrupted run trains on, in the same order, also
with another accumulate_grad_batches or a DataLoader worker; a change of the epoch's batches (the batch size, the
order, the number of processes) is refused with one line; a resume from an epoch's end may change them.

A short book (the first 6,100 characters of the story: 44 training windows of 32 tokens, so that a step of 4 and
one of 8 windows both end the epoch at window 44) and the tiny model. ONE uninterrupted run (2 epochs, batch size
4, one process) keeps a checkpoint after step 3, saved mid-epoch as a step-interval ModelCheckpoint saves it; every
case resumes from it. A callback records, per process, which windows each training batch held. Its resume on two
processes, refused, is one of tests/test_ddp.py's steps (its pair of processes runs it, from an uninterrupted run of
its own), as is a resume on two processes of a run stopped on two.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from gpt_lit.book_source import SHIPPED_BOOK_DIR, load_book
from gpt_lit.run.cli import main

WINDOWS = 44  # training windows of the short book (checked by the fixture)


class RecordWindows(Callback):
    """Writes ``windows.<rank>.json``: each training batch as [epoch, batch_idx, [window index, ...]], in order, and
    the epochs in which validation ran."""

    def __init__(self, folder: str):
        self.folder, self.batches, self.validated = Path(folder), [], []

    def on_train_start(self, trainer, pl_module):
        windows = trainer.datamodule.train_set
        self.index = {tuple(windows[i][0].tolist()): i for i in range(len(windows))}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        rows = [self.index[tuple(row.tolist())] for row in batch[0]]
        self.batches.append([trainer.current_epoch, batch_idx, rows])

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validated.append(trainer.current_epoch)

    def on_fit_end(self, trainer, pl_module):
        record = {"batches": self.batches, "validated": self.validated}
        (self.folder / f"windows.{trainer.global_rank}.json").write_text(json.dumps(record))


class SaveBeforeStep(Callback):
    """Saves ``path`` as training step ``step`` starts (the batch fetched, not trained on)."""

    def __init__(self, path: Path, step: int):
        self.path, self.step = path, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The chapter's shuffle, computed here: the permutation of n windows a generator seeded with seed + epoch draws."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def short_book(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    story = load_book(SHIPPED_BOOK_DIR)[:6100]
    (folder / "pg35.txt").write_text(f"*** START OF THE BOOK ***\n{story}\n*** END OF THE BOOK ***\n")
    return folder


def run_args(book: Path, logs: Path) -> list[str]:
    return [
        "--config", str(REPO / "configs/residual.yaml"), *TINY, "--data.stride", "32",
        "--data.data_dir", str(book), "--data.eval_train", "false", "--trainer.max_epochs", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.callbacks", "[]", "--trainer.logger", "false", "--trainer.default_root_dir", str(logs),
    ]  # fmt: skip


@dataclass
class Uninterrupted:
    args: list[str]  # the run's options (without a --ckpt_path)
    batches: list  # [epoch, batch_idx, windows] of every training batch
    step3: Path  # the checkpoint saved after step 3 of epoch 0
    before4: Path  # the one saved as step 4 starts: the same state, its batch fetched


def uninterrupted_run(root: Path) -> Uninterrupted:
    """The uninterrupted run, in this process, in ``root``; tests/test_ddp.py resumes it on two processes."""
    args = run_args(short_book(root / "book"), root / "logs")
    steps = ModelCheckpoint(dirpath=root / "steps", every_n_train_steps=3, save_top_k=-1, filename="{step}")
    before4 = SaveBeforeStep(root / "before4.ckpt", 3)
    fit = main(["fit", *args], extra_callbacks=[RecordWindows(root), steps, before4])
    assert len(fit.datamodule.train_set) == WINDOWS
    batches = json.loads((root / "windows.0.json").read_text())["batches"]
    return Uninterrupted(args, batches, root / "steps" / "step=3.ckpt", before4.path)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Uninterrupted:
    return uninterrupted_run(tmp_path_factory.mktemp("resume_windows"))


def resume(uninterrupted: Uninterrupted, folder: Path, *changes: str, ckpt: Path | None = None) -> dict:
    """Resume from the step-3 checkpoint (or ``ckpt``) with ``changes``, in this process; what it trained on."""
    main(["fit", *uninterrupted.args, *changes, "--ckpt_path", str(ckpt or uninterrupted.step3)],
         extra_callbacks=[RecordWindows(folder)])  # fmt: skip
    return json.loads((folder / "windows.0.json").read_text())


def epoch_windows(batches: list, epoch: int) -> list[int]:
    return [w for e, _, rows in batches if e == epoch for w in rows]


def test_the_uninterrupted_run_takes_each_epochs_seeded_order(uninterrupted):
    # Independently: the permutation of seed + epoch (data.seed 123), 11 steps of 4 an epoch.
    for epoch in (0, 1):
        assert epoch_windows(uninterrupted.batches, epoch) == epoch_order(WINDOWS, 123, epoch)


@pytest.mark.parametrize(
    "changes",
    [[], ["--trainer.accumulate_grad_batches", "2", "--trainer.max_epochs", "1"],
     ["--data.num_workers", "1", "--trainer.max_epochs", "1"]],
    ids=["same settings", "accumulate 1 -> 2", "num_workers 0 -> 1"],
)  # fmt: skip
def test_a_resume_trains_on_the_same_windows(uninterrupted, tmp_path, changes):
    resumed = resume(uninterrupted, tmp_path, *changes)
    epochs = 1 if "--trainer.max_epochs" in changes else 2  # the rest of epoch 0 shows it; the next only repeats it
    assert uninterrupted.batches[:3] + resumed["batches"] == [b for b in uninterrupted.batches if b[0] < epochs]
    assert resumed["validated"] == list(range(epochs))


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_resume_from_a_checkpoint_saved_as_a_step_starts_trains_that_step(uninterrupted, tmp_path, workers):
    resumed = resume(uninterrupted, tmp_path, "--data.num_workers", workers, "--trainer.max_epochs", "1",
                     ckpt=uninterrupted.before4)  # fmt: skip
    assert uninterrupted.batches[:3] + resumed["batches"] == [b for b in uninterrupted.batches if b[0] == 0]
    assert resumed["validated"] == [0]


@pytest.mark.parametrize(
    ("change", "named"),
    [(["--data.seed", "7"], "data.seed 123 (now 7)"), (["--data.batch_size", "8"], "data.batch_size 4 (now 8)")],
)
def test_a_resume_that_would_change_the_epochs_batches_is_refused_with_one_line(
    uninterrupted, tmp_path, capfd, change, named
):
    config = uninterrupted.step3.parents[1] / "logs" / "config.yaml"  # the run's, as it ran
    before = config.read_text()
    with pytest.raises(SystemExit) as stopped:
        resume(uninterrupted, tmp_path, *change)
    err = capfd.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line == (
        f"error: {uninterrupted.step3} was saved mid-epoch (epoch 0, after 12 of its 44 training windows) with "
        f"{named}: the rest of that epoch is not this run's batches. Resume with the checkpoint's settings until the "
        f"epoch ends, then change them, or resume from a checkpoint saved at the end of an epoch"
    )
    assert not (tmp_path / "windows.0.json").exists()  # nothing trained
    assert config.read_text() == before  # nor the run's config.yaml written over


@pytest.mark.parametrize(
    ("change", "batch"), [([], 4), (["--data.num_workers", "1"], 4), (["--data.batch_size", "8"], 8)],
    ids=["same settings", "a worker", "twice the batch size"],
)  # fmt: skip
def test_a_resume_from_an_epochs_end_trains_the_next_epoch_in_its_order(uninterrupted, tmp_path, change, batch):
    # The run's last.ckpt, saved at the end of its epoch 1; resumed for one more epoch, with a worker process (which
    # draws the sampler's indices as soon as the loader's iterator is made) or in batches of another size.
    last = uninterrupted.step3.parent / "last.ckpt"  # beside the run's other checkpoints
    resumed = main(["fit", *uninterrupted.args, *change, "--trainer.max_epochs", "3", "--ckpt_path", str(last)],
                   extra_callbacks=[RecordWindows(tmp_path)])  # fmt: skip
    record = json.loads((tmp_path / "windows.0.json").read_text())
    steps = WINDOWS // batch  # the last, partial batch is dropped
    assert [(e, i) for e, i, _ in record["batches"]] == [(2, i) for i in range(steps)]
    assert epoch_windows(record["batches"], 2) == epoch_order(WINDOWS, 123, 2)[: steps * batch]
    assert record["validated"] == [2]
    assert resumed.trainer.global_step == 22 + steps  # after the run's 2 epochs of 11 steps
