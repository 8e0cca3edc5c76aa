import functools
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Nothing here imports gpt_lit (torch, Lightning: ~5 s) when the module loads: pytest-xdist's controller loads this
# file before it starts the workers, and runs no test. The workers import it as the tests need it.

# pytest-xdist runs the suite on two worker processes (pyproject.toml's addopts). Each worker computes on one
# thread, and so does every process a test starts (they inherit OMP_NUM_THREADS): two workers, each with torch's
# thread pool of one per core, would fight over the cores and spin while they wait.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


def run_session(cwd: Path, pythonpath: list[Path], timeout: float) -> None:
    """Run ``cwd/session.py`` in a process group of its own (Lightning starts process 1 from it, in the same group),
    with no distributed variables inherited; kill the whole group if it hangs or fails, and assert it succeeded."""
    import signal
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    session = subprocess.Popen([sys.executable, "session.py"], cwd=cwd, env=env, start_new_session=True)
    try:
        session.wait(timeout=timeout)
    finally:
        if session.poll() is None or session.returncode != 0:
            os.killpg(session.pid, signal.SIGKILL)  # both processes: process 1 is in the same session
    assert session.returncode == 0


# residual.yaml's callbacks that draw, measure or log what TensorBoard shows (every one but ContinuationWriter).
DIAGNOSTICS = ("BlockGradNorms", "PositionSimilarity", "UnigramBaseline", "ChapterFigures", "AttentionMaps",
               "ResidualStream", "LogitLens", "PositionLoss", "Samples", "Throughput", "RunsTable")  # fmt: skip


@functools.cache
def residual_text_without(callbacks: tuple[str, ...]) -> str:
    """configs/residual.yaml's text without the entries of the callbacks named (``gpt_lit.diagnostics.X``,
    ``gpt_lit.callbacks.X``; each with its init_args and comment lines), everything else as shipped."""
    kept, dropping = [], False
    for line in (REPO / "configs" / "residual.yaml").read_text().splitlines(True):
        if line.strip().startswith(("- class_path: gpt_lit.callbacks.", "- class_path: gpt_lit.diagnostics.")):
            dropping = line.split("class_path: ", 1)[1].split()[0].rsplit(".", 1)[1] in callbacks
        elif dropping and len(line) - len(line.lstrip()) <= 4:  # the next entry or key: the dropped one has ended
            dropping = False
        if not dropping:
            kept.append(line)
    return "".join(kept)


@functools.cache
def residual_file_without(callbacks: tuple[str, ...]) -> str:
    """``residual_text_without(callbacks)`` as a file named residual.yaml (runs keep the name)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gpt_lit_configs_")) / "residual.yaml"
    path.write_text(residual_text_without(callbacks))
    return str(path)


def residual_without_throughput() -> str:
    """configs/residual.yaml without the Throughput callback: its rates are wall-clock times, never the same in two
    runs, so runs compared tag by tag leave it out."""
    return residual_file_without(("Throughput",))


def residual_without_diagnostics_text() -> str:
    """configs/residual.yaml's text without the DIAGNOSTICS: for tests that check where checkpoints go or what a
    stop does and read no diagnostic. Their fits take about half the time (test_diagnostics.py,
    test_inside_block.py, the matrices and test_resume.py run the diagnostics)."""
    import yaml

    text = residual_text_without(DIAGNOSTICS)
    callbacks = [c["class_path"] for c in yaml.safe_load(text)["trainer"]["callbacks"]]
    assert callbacks == ["gpt_lit.predictions.ContinuationWriter", "lightning.pytorch.callbacks.ModelCheckpoint"]
    return text


def residual_without_diagnostics() -> str:
    """``residual_without_diagnostics_text`` as a file named residual.yaml."""
    residual_without_diagnostics_text()  # checks what is left
    return residual_file_without(DIAGNOSTICS)


# A model small enough to train for a few steps in seconds, same code paths as the chapter's configs.
TINY = [
    "--model.config.emb_dim", "32",
    "--model.config.n_layers", "2",
    "--model.config.n_heads", "2",
    "--data.context_length", "32",
    "--data.stride", "128",  # a window every 128 tokens, as at the chapter's context: 317 training, 37 validation
    "--data.batch_size", "4",
    "--data.eval_batch_size", "64",
    "--trainer.accelerator", "cpu",  # where `auto` would pick a GPU (MPS on a Mac), the tests still run on the CPU
]  # fmt: skip


# Trainer arguments for the tests' in-process runs: CPU, nothing written but the logger's events, quiet.
QUIET_TRAINER = {
    "accelerator": "cpu",
    "num_sanity_val_steps": 0,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


@pytest.fixture(scope="session", autouse=True)
def session_environment() -> None:
    """The tests read the book that ships with gpt_lit, as a reader's first run does: no other copy, no network.
    And Lightning's loggers propagate, so tests can read what a run says (caplog): imported before pytest's log
    capture starts, Lightning makes them print instead."""
    import gc

    from gpt_lit.book_source import DATA_DIR_ENV  # imports Lightning

    os.environ.pop(DATA_DIR_ENV, None)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).propagate = True
    gc.freeze()  # what the test modules' imports made, as gpt_lit/__main__.py does: full collections skip it


@pytest.fixture(scope="session")
def book_path() -> Path:
    from gpt_lit.book_source import SHIPPED_BOOK_DIR

    book = SHIPPED_BOOK_DIR / "pg35.txt"
    if not book.is_file():
        pytest.fail(f"The Time Machine is not at {book}: the package's shipped book is missing")
    return book


@dataclass
class TinyRun:
    """A finished tiny `fit` of residual.yaml, shared by the tests that only read a run (see ``tiny_run``)."""

    root: Path  # the folder the run was started in: lightning_logs/residual/version_0 is under it
    version: Path  # lightning_logs/residual/version_0
    args: list[str]  # the fit's options, for a `test`/`predict`/`--ckpt_path last` on the same config
    last_val: float  # loss/val after the last epoch, as the run computed it


# 2 epochs of 3 steps (lr 0.01, so the weights move), no whole-training-set evaluation; its validation set
# (37 windows of 32 tokens, one every data.stride = 128 tokens, residual.yaml's) spans three uneven batches of
# 16, 16 and 5 windows.
TINY_RUN = [
    "--config", "residual.yaml", *TINY, "--data.eval_train", "false", "--model.lr", "0.01",
    "--data.eval_batch_size", "16",
    "--trainer.limit_train_batches", "3",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> TinyRun:
    """One tiny run, made once per session, in this process: `fit` for 2 epochs (checkpoints best-epoch01.ckpt
    and last.ckpt). Tests may add test/ and predict/ outputs beside it, never change what `fit` wrote."""
    from gpt_lit.run.cli import main

    root = tmp_path_factory.mktemp("tiny_run")
    before = os.getcwd()
    os.chdir(root)  # lightning_logs/ goes here, as in a reader's folder
    try:
        fit = main(["fit", *TINY_RUN, "--trainer.max_epochs", "2"])
    finally:
        os.chdir(before)
    last_val = fit.trainer.callback_metrics["loss/val"].item()
    return TinyRun(root, root / "lightning_logs" / "residual" / "version_0", list(TINY_RUN), last_val)


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows for a run folder (all its event files), as (step, value) lists."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def figure_pixels(fig):
    """A figure drawn by a new Agg canvas, as ``add_figure`` draws it: (height, width, 3) uint8 RGB."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    (canvas := FigureCanvasAgg(fig)).draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def windows_by_hand(ids, context_length: int, stride: int):
    """(inputs, targets) of every window, counted by hand: a window starts at s when s + context_length + 1 <= len(ids)
    (its target needs one token more), at s = 0, stride, 2 * stride, ..."""
    import torch

    starts, s = [], 0
    while s + context_length + 1 <= len(ids):
        starts.append(s)
        s += stride
    x = torch.stack([ids[s : s + context_length] for s in starts])
    y = torch.stack([ids[s + 1 : s + context_length + 1] for s in starts])
    return x, y


# The chapter's experiments and its untrained GPT-2 are the suite's costliest computations; each is made once per
# session and shared by the tests that read it (the model is only ever put in eval mode and read).
# (Bound here, so that a test may put these in scripts/reproduce_chapter.py's place.)
# chapter_experiment: its residual_experiment; untrained_gpt2; chapter_continuation: its continuation
# (greedy, so the same every time). Made on first use (PEP 562's module __getattr__), so that loading this file
# imports no gpt_lit.
CACHED = {"chapter_experiment": "residual_experiment", "untrained_gpt2": "untrained_gpt2",
          "chapter_continuation": "continuation"}  # fmt: skip


def __getattr__(name: str):
    if name not in CACHED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = cached = functools.cache(getattr(load_script("reproduce_chapter"), CACHED[name]))
    return cached


def load_script(name: str):
    """scripts/<name>.py as a module (its ``main(argv)`` is what `python scripts/<name>.py` runs), without a new
    Python process: the scripts' imports are the package's, already loaded here."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as importlib's recipe does: a dataclass in it looks its module up there
    spec.loader.exec_module(module)
    return module


# Two tiers: `python -m pytest -q` tests every behaviour at least once; with ``GPT_LIT_TESTS=full`` (.ci/run) the
# tests marked ``full`` run too: every case of the matrices, and the same behaviours in other process layouts (two
# nodes, spawned workers, the installed wheel). Without it they are deselected (docs/testing.md).
FULL = os.environ.get("GPT_LIT_TESTS") == "full"

# pytest-xdist (addopts: two workers, --dist loadgroup) runs the tests that share a computation made once per
# process on one worker, so it is made once: the chapter's experiments and untrained GPT-2 (the caches above), each
# module's module-scoped runs. The fault matrix's cases (the `full` tier) go out one by one, its uninterrupted run
# made once on each worker. The session's tiny run is made once on each worker: the
# files that read it go out one by one; test_workers.py checks that a group reaches one worker. Every other test is a
# unit of its own. The units go out heaviest first, so that the two workers end together.
GROUPS = {
    **dict.fromkeys(["test_chapter_experiments", "test_model", "test_scripts", "test_similarity_by_block"], "chapter"),
    **{name: name for name in ["test_answers", "test_bad_inputs", "test_cli", "test_data", "test_ddp",
                               "test_diagnostics", "test_export", "test_inside_block", "test_inspect_page",
                               "test_packaging", "test_pretrained", "test_readme", "test_resume_windows",
                               "test_robustness", "test_run_settings", "test_safe_checkpoints",
                               "test_tensorboard_docs", "test_when_and_whom", "test_workers"]},
}  # fmt: skip
# The seconds of each group, and of each test of a file that is not a group: `--durations=0` under xdist, summed per
# group, rounded (on a shared 2-core machine: what counts is their order). test_ddp's session runs on two processes;
# test_packaging's (the `full` tier's) installs the wheel.
SECONDS = {"test_packaging": 150, "test_ddp": 43, "test_readme": 30, "test_pretrained": 23,
           "test_resume_windows": 18, "chapter": 16, "test_bad_inputs": 13, "test_answers": 12, "test_inside_block": 12,
           "test_when_and_whom": 11, "test_robustness": 11, "test_safe_checkpoints": 11, "test_export": 8,
           "test_tensorboard_docs": 7, "test_cli": 6, "test_inspect_page": 6, "test_run_settings": 4,
           "test_diagnostics": 3,
           # torch.compile: seconds with its kernels cached, a minute on a machine's first run
           "tests/test_bench.py::test_compiled_model_gives_the_same_losses_and_checkpoint_keys": 6,
           "tests/test_smoke.py::test_fit_resume_test_predict": 8}  # fmt: skip
SECONDS_EACH = {"test_fault_matrix": 9, "test_settings_matrix": 7, "test_resume": 3, "test_run_folders": 3,
                "test_checkpointing": 1, "test_bench": 1}  # test_settings_matrix: a case (its two tests)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


def unit(item: pytest.Item) -> str | None:
    """The group ``item`` shares a worker with (None: a unit of its own)."""
    if module_of(item.nodeid) == "test_settings_matrix" and hasattr(item, "callspec"):
        return f"test_settings_matrix:{item.callspec.id}"  # a case's two tests read its one set of runs
    return GROUPS.get(module_of(item.nodeid))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which adds each xdist_group mark's name to the test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``full`` tier without GPT_LIT_TESTS=full. On an xdist worker (whose collection the scheduler
    reads), mark each test of a group ``xdist_group`` (``--dist loadgroup`` sends a group to one worker) and put the
    heaviest units first: with ``--no-loadscope-reorder`` xdist hands them out in the order of their first tests."""
    if not FULL and (full := [item for item in items if item.get_closest_marker("full")]):
        config.hook.pytest_deselected(items=full)
        items[:] = [item for item in items if not item.get_closest_marker("full")]
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    units = {id(item): unit(item) for item in items}
    for item in items:
        if units[id(item)] is not None:
            item.add_marker(pytest.mark.xdist_group(units[id(item)]))
    seconds = {id(item): SECONDS.get(units[id(item)] or item.nodeid, SECONDS_EACH.get(module_of(item.nodeid), 0))
               for item in items}  # fmt: skip
    items.sort(key=lambda item: -seconds[id(item)])  # stable: the same seconds keep their order
