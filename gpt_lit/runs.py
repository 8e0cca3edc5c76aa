"""Run folders: where a config's runs are, the newest one's ``last``/``best`` checkpoint, and where ``test`` and
``predict`` on a run's checkpoint write (``<run>/test/X/``, ``<run>/predict/X/``, beside what they evaluate)."""

from __future__ import annotations

import re
from pathlib import Path

from jsonargparse import Namespace

from gpt_lit.checkpoint_reading import read_checkpoint
from gpt_lit.errors import GptLitError

PROG = "python -m gpt_lit"
# ckpt_path values Lightning resolves itself rather than reading a file
LIGHTNING_CKPT_NAMES = {"last", "best", "hpc", "registry"}


def runs_folder(trainer: Namespace) -> Path | None:
    """Where the configured logger puts the ``version_N`` run folders (None for a logger without one)."""
    logger, root = trainer.get("logger"), trainer.get("default_root_dir") or "."
    if logger is None or logger is True:  # Lightning's default TensorBoardLogger
        return Path(root) / "lightning_logs"
    init = logger.get("init_args") if isinstance(logger, Namespace) else None
    if init is None or "save_dir" not in init:
        return None
    return Path(init.get("save_dir") or root) / (init.get("name") or "")


def run_of(ckpt_path: str | None) -> Path | None:
    """The run folder ``<run>`` of ``<run>/checkpoints/X.ckpt``, if that is where the checkpoint is."""
    if not ckpt_path or ckpt_path in LIGHTNING_CKPT_NAMES or "://" in ckpt_path:
        return None
    run = Path(ckpt_path).parent.parent
    is_run = (run / "config.yaml").is_file() or any(run.glob("events.out.tfevents.*"))
    return run if Path(ckpt_path).parent.name == "checkpoints" and is_run else None


def latest_checkpoint(folder: Path | None, which: str, trust: bool = False) -> str:
    """``last.ckpt`` (which="last") or the best checkpoint (which="best") of the newest run under ``folder``
    (found in last.ckpt, read as data unless ``trust``: see ``read_checkpoint``)."""
    looked = f"{folder}/version_*/checkpoints/last.ckpt" if folder else "nowhere: the logger has no save_dir"
    versions = folder.glob("version_*/checkpoints/last.ckpt") if folder else []
    number = lambda p: int(m[1]) if (m := re.fullmatch(r"version_(\d+)", p.parent.parent.name)) else -1  # noqa: E731
    found = sorted(versions, key=number)
    if not found:
        raise GptLitError(
            f"--ckpt_path {which}: no run with a checkpoint; looked for {looked} (from {Path.cwd()}). Train one "
            f"with `{PROG} fit` and the same config, or give a checkpoint's path"
        )
    last = found[-1]
    if which == "last":
        return str(last)
    states = read_checkpoint(str(last), trust)[0].get("callbacks", {}).values()
    best = [s["best_model_path"] for s in states if isinstance(s, dict) and s.get("best_model_path")]
    if not best or not (last.parent / Path(best[0]).name).is_file():
        raise GptLitError(
            f"--ckpt_path best: the latest run, {last.parent.parent}, keeps no best checkpoint (its config has no "
            f"ModelCheckpoint with a monitor, or the file is gone); use --ckpt_path last or a checkpoint's path"
        )
    return str(last.parent / Path(best[0]).name)


def log_beside_run(config: Namespace, subcommand: str) -> None:
    """Where ``test`` and ``predict`` write. ``config`` is the parsed configuration of ``test`` or ``predict``
    (the CLI's ``config[subcommand]``).

    ``test`` on ``<run>/checkpoints/X.ckpt``: the config's logger goes to ``<run>/test/X/``, so TensorBoard shows
    the test loss beside the run. ``predict`` logs nothing (TensorBoard would list an empty run); its folder,
    ``<run>/predict/X/`` for a run's checkpoint and the next ``version_N`` of the config's runs otherwise, becomes
    the trainer's ``default_root_dir``, where ContinuationWriter saves ``continuations.txt``.
    """
    run = run_of(config.get("ckpt_path"))
    logger = config.trainer.get("logger")
    init = logger.get("init_args") if isinstance(logger, Namespace) else None
    if subcommand == "predict":
        folder = run / "predict" / Path(config.ckpt_path).stem if run else next_run(config.trainer)
        config.trainer.logger = False
        if folder is not None:
            config.trainer.default_root_dir = str(folder)
    elif run and init is not None and "save_dir" in init:
        init.save_dir, init.name = str(run), subcommand
        init.version = Path(config.ckpt_path).stem


def next_run(trainer: Namespace) -> Path | None:
    """The run folder the configured logger would create: its ``version`` if set, else the next ``version_N``."""
    folder = runs_folder(trainer)
    if folder is None:
        return None
    logger = trainer.get("logger")
    init = logger.get("init_args") if isinstance(logger, Namespace) else None
    version = init.get("version") if init is not None else None
    if version is None:
        numbers = [int(m[1]) for p in folder.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", p.name))]
        version = max(numbers, default=-1) + 1
    return folder / (version if isinstance(version, str) else f"version_{version}")
