"""The run plan (what a command does with its checkpoint, decided once as the command line is parsed) and the run
folders it uses: the newest run's ``last``/``best`` checkpoint, and where validate, test and predict write."""

import copy
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from gpt_lit.errors import GptLitError
from gpt_lit.run.checkpoints import TRUST_OPTION, config_fields, read_checkpoint

PROG = "python -m gpt_lit"
LIGHTNING_CKPT_NAMES = {"last", "best", "hpc", "registry"}  # ckpt_path values that name no file


@dataclasses.dataclass(frozen=True)
class RunPlan:
    ckpt_path: str | None  # what Lightning restores: "last"/"best" resolved to a file
    weights_only: bool  # how Lightning's restore loads it
    run: Path | None = None  # the run folder of <run>/checkpoints/X.ckpt
    # What the file holds, without the tensors (which would keep the mapped file open); None: only Lightning reads it
    shapes: dict[str, tuple[int, ...]] | None = None  # each state_dict tensor's shape
    config: dict[str, Any] | None = None  # the GPTConfig fields in its hyperparameters ({} when it has none)
    data_state: dict[str, Any] | None = None  # the training loader's state (epoch_order.TrainLoader), {} if none
    epoch_end: bool = False  # saved in on_train_epoch_end: the fit loop's epoch processed, not yet completed


def make_plan(config: Namespace) -> RunPlan:
    """The plan of a subcommand from its parsed configuration; a missing or refused checkpoint fails here."""
    trusted = bool(config.get("trust_checkpoint"))
    if config.get("weights_only") is False:  # Lightning's option stays parseable (config.yaml has it), not a switch
        raise GptLitError(f"--weights_only false: to load a checkpoint you trust as code, use {TRUST_OPTION}")
    path = config.get("ckpt_path")
    if path in ("last", "best"):
        path = latest_checkpoint(runs_folder(config.trainer), path, trusted, checkpoints_dirpath(config.trainer))
    if not path or path in LIGHTNING_CKPT_NAMES or "://" in path:
        return RunPlan(path, not trusted)  # a file only Lightning reads: loaded as the user trusts it
    ckpt, needed_trust = read_checkpoint(path, trusted)
    fit_loop = (ckpt.get("loops") or {}).get("fit_loop") or {}
    loader_states = fit_loop.get("state_dict", {}).get("combined_loader") or [{}]  # as Lightning's fit loop saves
    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in ckpt["state_dict"].items()}
    gpt_config = config_fields((ckpt.get("hyper_parameters") or {}).get("config"))
    epochs = fit_loop.get("epoch_progress", {}).get("total", {})
    epoch_end = epochs.get("processed", 0) == epochs.get("completed", 0) + 1
    return RunPlan(path, not needed_trust, run_of(path), shapes, gpt_config, copy.deepcopy(loader_states[0]), epoch_end)


def listed(value: object) -> list:
    """A trainer option that takes one or a list (logger, callbacks, plugins), as a list."""
    return list(value) if isinstance(value, list) else [value] if value else []


def inits(value: object) -> list[Namespace]:
    """The ``init_args`` of a config's logger or callbacks."""
    return [one.init_args for one in listed(value) if isinstance(one, Namespace) and one.get("init_args") is not None]


def local_folders(trainer: Namespace) -> None:
    """The config's folders as Lightning's loggers read them (``~`` expanded, ``file://`` dropped)."""
    for init in [trainer, *inits(trainer.get("logger")), *inits(trainer.get("callbacks"))]:
        for key in ("default_root_dir", "save_dir", "dirpath"):
            if isinstance(init.get(key), str):
                init[key] = os.path.expanduser(init[key].removeprefix("file://"))


def runs_folder(trainer: Namespace) -> Path | None:
    """The folder of the (first) logger's ``version_N`` runs; None for a logger without one."""
    logger, root = trainer.get("logger"), trainer.get("default_root_dir") or "."
    logger = (logger or [False])[0] if isinstance(logger, list) else logger
    if logger is None or logger is True:  # Lightning's default TensorBoardLogger
        return Path(root) / "lightning_logs"
    init = inits(logger)
    if not init or "save_dir" not in init[0]:
        return None
    return Path(init[0].get("save_dir") or root) / (init[0].get("name") or "")


def run_of(ckpt_path: str | None) -> Path | None:
    """The run folder ``<run>`` of ``<run>/checkpoints/X.ckpt``, if that is where the checkpoint is."""
    if not ckpt_path or ckpt_path in LIGHTNING_CKPT_NAMES or "://" in ckpt_path:
        return None
    run = Path(ckpt_path).parent.parent
    is_run = (run / "config.yaml").is_file() or any(run.glob("events.out.tfevents.*"))
    return run if Path(ckpt_path).parent.name == "checkpoints" and is_run else None


def version_number(run: Path) -> int:
    """N of a ``version_N`` folder (-1 for another name)."""
    return int(run.name.removeprefix("version_")) if re.fullmatch(r"version_\d+", run.name) else -1


def next_version(folder: Path) -> int:
    """The N of the next ``version_N`` under ``folder``, as Lightning's loggers number their runs."""
    return max((version_number(p) for p in folder.glob("version_*") if p.is_dir()), default=-1) + 1


def checkpoints_dirpath(trainer: Namespace) -> Path | None:
    """The ``dirpath`` of the config's ModelCheckpoint (one with a monitor first), where last.ckpt goes; None: unset."""
    callbacks = [c for c in listed(trainer.get("callbacks"))
                 if isinstance(c, Namespace) and "ModelCheckpoint" in str(c.get("class_path"))]  # fmt: skip
    ours = sorted(inits(callbacks), key=lambda i: not i.get("monitor"))  # as LastCheckpoint picks the live one
    return Path(ours[0].dirpath) if ours and ours[0].get("dirpath") else None


def nothing_to_read(which: str, what: str, give: str = " and the same config, or give") -> GptLitError:
    return GptLitError(f"--ckpt_path {which}: {what} (from {Path.cwd()}). Train one with `{PROG} fit`{give} a "
                       "checkpoint's path")  # fmt: skip


def latest_checkpoint(folder: Path | None, which: str, trust: bool = False, dirpath: Path | None = None) -> str:
    """``--ckpt_path last|best``: last.ckpt or the best it names, in ``dirpath``, else in ``folder``'s newest run."""
    run = dirpath
    if dirpath is not None and not (dirpath / "last.ckpt").is_file():
        raise nothing_to_read(which, f"no last.ckpt in {dirpath}, the config's ModelCheckpoint's dirpath")
    if dirpath is None and folder is None:
        raise GptLitError(f"--ckpt_path {which}: the logger has no save_dir, so there is no run folder to look in; "
                          "give a checkpoint's path")  # fmt: skip
    if dirpath is None:
        runs = sorted((p for p in folder.glob("version_*") if p.is_dir() and version_number(p) >= 0),
                      key=version_number)  # fmt: skip
        if not runs:
            raise nothing_to_read(which, f"no run in {folder}")
        run, dirpath = runs[-1], runs[-1] / "checkpoints"
        if not (dirpath / "last.ckpt").is_file():
            older = [r for r in runs[:-1] if (r / "checkpoints" / "last.ckpt").is_file()]
            hint = f"; the newest with one: --ckpt_path {older[-1]}/checkpoints/last.ckpt" if older else ""
            raise GptLitError(f"--ckpt_path {which}: the newest run, {run}, has no checkpoint (no last.ckpt in "
                              f"{dirpath}: it stopped before its first save, or ran with checkpointing "
                              f"off){hint}")  # fmt: skip
    last = dirpath / "last.ckpt"
    return str(last) if which == "last" else best_of(last, run, trust)


def best_of(last: Path, run: Path, trust: bool) -> str:
    """The best file that ``last`` (a run's last.ckpt) names, beside it: that of the ModelCheckpoint with a monitor."""
    states = read_checkpoint(str(last), trust)[0].get("callbacks", {})
    ranked = {k: s for k, s in states.items() if isinstance(s, dict) and s.get("monitor") and "best_model_path" in s}
    if len(ranked) > 1:
        files = "; ".join(f"{key}: {s['best_model_path'] or 'none yet'}" for key, s in ranked.items())
        raise GptLitError(f"--ckpt_path best: the newest run, {run}, has {len(ranked)} ModelCheckpoints with a "
                          f"monitor, each with its own best ({files}); give the one you want as --ckpt_path <its "
                          f"path>")  # fmt: skip
    best = [last.parent / Path(s["best_model_path"]).name for s in ranked.values() if s["best_model_path"]]
    if not best or not best[0].is_file():
        raise GptLitError(f"--ckpt_path best: the newest run, {run}, keeps no best checkpoint (its config has no "
                          f"ModelCheckpoint with a monitor, or the file is gone); use --ckpt_path last or a "
                          f"checkpoint's path")  # fmt: skip
    return str(best[0])


def log_beside_run(config: Namespace, subcommand: str, ckpt_path: str | None, run: Path | None) -> None:
    """validate or test on ``<run>/checkpoints/X.ckpt`` log to ``<run>/<subcommand>/X/``, so that no new
    ``version_N`` becomes the newest run; predict logs nothing, writing into ``<run>/predict/X/`` or the next run."""
    if subcommand == "predict":
        if run and ckpt_path:
            folder = run / "predict" / Path(ckpt_path).stem
        elif (folder := runs_folder(config.trainer)) is not None:  # the logger's next run: its version, else the next N
            version = next((init.get("version") for init in inits(config.trainer.get("logger"))), None)
            version = next_version(folder) if version is None else version
            folder = folder / (version if isinstance(version, str) else f"version_{version}")
        config.trainer.logger = False
        if folder is not None:
            config.trainer.default_root_dir = str(folder)
        return
    for init in inits(config.trainer.get("logger")) if run and ckpt_path else []:
        if "save_dir" in init:
            init.save_dir, init.name, init.version = str(run), subcommand, Path(ckpt_path).stem


def continue_run(config: Namespace, run: Path | None) -> None:
    """A resume with a list of loggers: each goes on in the checkpoint's run (the command line sets one version)."""
    logger = config.trainer.get("logger")
    if run is None or not isinstance(logger, list) or runs_folder(config.trainer) != run.parent:
        return
    for init in inits(logger):
        if "version" in init and init.get("version") is None:
            init.version = version_number(run) if version_number(run) >= 0 else run.name


def one_folder_per_run(trainer: Namespace) -> list[Namespace]:
    """Loggers of a list sharing a save_dir and name get one ``version_N`` (each would number its own); returned."""
    shared: dict[Path | None, list[Namespace]] = {}
    for each in trainer.get("logger") if isinstance(trainer.get("logger"), list) else []:
        init = inits(each)
        if init and "version" in init[0] and init[0].get("version") is None:
            folder = runs_folder(Namespace(logger=each, default_root_dir=trainer.get("default_root_dir")))
            shared.setdefault(folder, []).append(init[0])
    given = [(folder, init) for folder, group in shared.items() if folder and len(group) > 1 for init in group]
    for folder, init in given:
        init.version = next_version(folder)
    return [init for _, init in given]


def newest_config_runs(base: Path, which: str) -> Path:
    """The one folder under ``base`` (lightning_logs) that holds ``version_N`` runs: ``base/<name>`` or ``base``."""
    folders = sorted({p.parent for pattern in ("version_*", "*/version_*") for p in base.glob(pattern) if p.is_dir()})
    if not folders:
        raise nothing_to_read(which, f"no run in {base}", ", or give --config (the config whose runs to use) or")
    if len(folders) > 1:
        names = [f.name for f in folders if f != base]
        raise GptLitError(f"--ckpt_path {which} without --config: {base} holds the runs of {len(folders)} configs "
                          f"({', '.join(names)}{', and unnamed ones' if base in folders else ''}); say whose with "
                          f"--config (e.g. --config {names[0]}) or give a checkpoint's path")  # fmt: skip
    return folders[0]


def run_config(subcommand: str | None, config: Namespace) -> tuple[str, str] | None:
    """validate/test/predict/export with ``--ckpt_path`` and no ``--config``: the checkpoint's run's config.yaml and
    the checkpoint's path (``last``/``best``: the newest run's in lightning_logs/); None outside a run folder."""
    ckpt = config.get("ckpt_path")
    if subcommand not in ("validate", "test", "predict", "export") or config.get("config") or not ckpt:
        return None
    path = ckpt
    if ckpt in ("last", "best"):
        local_folders(config.trainer)
        base = Path(config.trainer.get("default_root_dir") or ".") / "lightning_logs"
        path = latest_checkpoint(newest_config_runs(base, ckpt), ckpt, bool(config.get("trust_checkpoint")))
    run = run_of(path)
    if run is None or not (run / "config.yaml").is_file():
        if ckpt in ("last", "best"):
            raise GptLitError(f"--ckpt_path {ckpt}: the run of {path} has no config.yaml; add --config")
        return None
    return str(run / "config.yaml"), path
