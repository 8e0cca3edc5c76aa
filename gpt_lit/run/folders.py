"""Run folders: where a config's runs are, the newest one's ``last``/``best`` checkpoint, and where ``validate``,
``test`` and ``predict`` on a run's checkpoint write (``<run>/validate/X/``, ``<run>/test/X/``, ``<run>/predict/X/``,
beside what they evaluate)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from jsonargparse import Namespace

from gpt_lit.errors import GptLitError
from gpt_lit.run.reading import read_checkpoint

PROG = "python -m gpt_lit"
# ckpt_path values Lightning resolves itself rather than reading a file
LIGHTNING_CKPT_NAMES = {"last", "best", "hpc", "registry"}
# The subcommands that read a checkpoint and can take its run's settings (run_config)
READING_SUBCOMMANDS = ("validate", "test", "predict", "export")
DEFAULT_LOGS = "lightning_logs"  # where LightningCLI's default logger, and every shipped config, keeps its runs


def local_folders(trainer: Namespace) -> None:
    """The trainer's folders (``default_root_dir``, each logger's ``save_dir``, each callback's ``dirpath``) as
    plain paths: ``~`` expanded and a ``file://`` URL's path, so that the events, the checkpoints and
    ``--ckpt_path last|best`` all use one folder (Lightning's loggers expand ``~``, the joins beside them do not)."""

    def local(path: object) -> object:
        return os.path.expanduser(path.removeprefix("file://")) if isinstance(path, str) else path

    trainer.default_root_dir = local(trainer.get("default_root_dir"))
    listed = [trainer.get("logger"), trainer.get("callbacks")]
    for each in [item for one in listed for item in (one if isinstance(one, list) else [one])]:
        init = each.get("init_args") if isinstance(each, Namespace) else None
        for key in ("save_dir", "dirpath"):
            if init is not None and key in init:
                init[key] = local(init[key])


def runs_folder(trainer: Namespace) -> Path | None:
    """Where the configured logger (the first of a list, as Lightning's ``log_dir``) puts the ``version_N`` run
    folders (None for a logger without one)."""
    logger, root = trainer.get("logger"), trainer.get("default_root_dir") or "."
    if isinstance(logger, list):
        logger = logger[0] if logger else False
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


def version_number(run: Path) -> int:
    """N of a ``version_N`` run folder (-1 for another name): version_10 is newer than version_2."""
    match = re.fullmatch(r"version_(\d+)", run.name)
    return int(match[1]) if match else -1


def checkpoints_dirpath(trainer: Namespace) -> Path | None:
    """The ``dirpath`` the config gives its ModelCheckpoint (the one with a monitor first), where last.ckpt goes
    too (None when Lightning's folder in the run is used)."""
    callbacks = trainer.get("callbacks") or []
    inits = [c.get("init_args") for c in callbacks if isinstance(c, Namespace) and "ModelCheckpoint" in c.get(
        "class_path", "")]  # fmt: skip
    inits = sorted((i for i in inits if i is not None and i.get("dirpath")), key=lambda i: not i.get("monitor"))
    return Path(inits[0].get("dirpath")) if inits else None


def nothing_to_read(which: str, what: str, config_given: bool = True) -> GptLitError:
    """``--ckpt_path last|best`` found ``what`` ("no run in <folder>"): train one, or give a checkpoint's path."""
    give = " and the same config, or give" if config_given else ", or give --config (the config whose runs to use) or"
    return GptLitError(
        f"--ckpt_path {which}: {what} (from {Path.cwd()}). Train one with `{PROG} fit`{give} a checkpoint's path"
    )


def latest_checkpoint(folder: Path | None, which: str, trust: bool = False, dirpath: Path | None = None) -> str:
    """``last.ckpt`` (which="last") or the best checkpoint (which="best") of the newest run under ``folder``
    (found in last.ckpt, read as data unless ``trust``: see ``read_checkpoint``); in ``dirpath`` instead where the
    config's ModelCheckpoint gives one (``checkpoints_dirpath``)."""
    if dirpath is not None:
        last = dirpath / "last.ckpt"
        if not last.is_file():
            raise nothing_to_read(which, f"no last.ckpt in {dirpath}, the config's ModelCheckpoint's dirpath")
        return str(last) if which == "last" else best_of(last, dirpath, trust)
    if folder is None:
        raise GptLitError(
            f"--ckpt_path {which}: the logger has no save_dir, so there is no run folder to look in; give a "
            f"checkpoint's path"
        )
    runs = sorted((p for p in folder.glob("version_*") if p.is_dir() and version_number(p) >= 0), key=version_number)
    if not runs:
        raise nothing_to_read(which, f"no run in {folder}")
    run = runs[-1]
    last = run / "checkpoints" / "last.ckpt"
    if not last.is_file():
        older = [r for r in runs[:-1] if (r / "checkpoints" / "last.ckpt").is_file()]
        hint = f"; the newest with one: --ckpt_path {older[-1]}/checkpoints/last.ckpt" if older else ""
        raise GptLitError(
            f"--ckpt_path {which}: the newest run, {run}, has no checkpoint (no {last.name} in {last.parent}: it "
            f"stopped before its first save, or ran with checkpointing off){hint}"
        )
    if which == "last":
        return str(last)
    return best_of(last, run, trust)


def best_of(last: Path, run: Path, trust: bool) -> str:
    """The best checkpoint that ``last`` (a run's last.ckpt) names, beside it."""
    states = read_checkpoint(str(last), trust)[0].get("callbacks", {})
    # The best file is the one of the ModelCheckpoint that has a monitor (one without keeps its latest files).
    ranked = {k: s for k, s in states.items() if isinstance(s, dict) and s.get("monitor") and "best_model_path" in s}
    if len(ranked) > 1:
        files = "; ".join(f"{key}: {s['best_model_path'] or 'none yet'}" for key, s in ranked.items())
        raise GptLitError(
            f"--ckpt_path best: the newest run, {run}, has {len(ranked)} ModelCheckpoints with a monitor, each with "
            f"its own best ({files}); give the one you want as --ckpt_path <its path>"
        )
    best = [s["best_model_path"] for s in ranked.values() if s["best_model_path"]]
    if not best or not (last.parent / Path(best[0]).name).is_file():
        raise GptLitError(
            f"--ckpt_path best: the newest run, {run}, keeps no best checkpoint (its config has no "
            f"ModelCheckpoint with a monitor, or the file is gone); use --ckpt_path last or a checkpoint's path"
        )
    return str(last.parent / Path(best[0]).name)


def log_beside_run(config: Namespace, subcommand: str, ckpt_path: str | None, run: Path | None) -> None:
    """Where ``validate``, ``test`` and ``predict`` write. ``config`` is the parsed configuration of the subcommand
    (the CLI's ``config[subcommand]``); ``ckpt_path`` the checkpoint, in the folder ``run`` (``run_of``).

    ``validate`` or ``test`` on ``<run>/checkpoints/X.ckpt``: the config's loggers (each of a list) go to
    ``<run>/validate/X/`` or ``<run>/test/X/``, so TensorBoard shows the loss beside the run, and no new
    ``version_N`` becomes the newest run, the one ``--ckpt_path last`` reads. ``predict`` logs nothing
    (TensorBoard would list an empty run); its folder, ``<run>/predict/X/`` for a run's checkpoint and the next
    ``version_N`` of the config's runs otherwise, becomes the trainer's ``default_root_dir``, where
    ContinuationWriter saves ``continuations.txt``.
    """
    if subcommand == "predict":
        folder = run / "predict" / Path(ckpt_path).stem if run and ckpt_path else next_run(config.trainer)
        config.trainer.logger = False
        if folder is not None:
            config.trainer.default_root_dir = str(folder)
        return
    loggers = config.trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init = logger.get("init_args") if isinstance(logger, Namespace) else None
        if run and ckpt_path and init is not None and "save_dir" in init:
            init.save_dir, init.name = str(run), subcommand
            init.version = Path(ckpt_path).stem


def continue_run(config: Namespace, run: Path | None) -> None:
    """``fit --ckpt_path <run>/checkpoints/X.ckpt`` with several loggers: each goes on logging in the run's folder
    (its version, where the config leaves it to the logger), as the first logger's ``version`` given on the command
    line does for one logger (a command line cannot give a version to each logger of a list). ``run``: the
    checkpoint's run folder (``run_of``)."""
    logger = config.trainer.get("logger")
    if run is None or not isinstance(logger, list) or runs_folder(config.trainer) != run.parent:
        return
    version = version_number(run)
    for each in logger:
        init = each.get("init_args") if isinstance(each, Namespace) else None
        if init is not None and "version" in init and init.get("version") is None:
            init.version = version if version >= 0 else run.name


def next_run(trainer: Namespace) -> Path | None:
    """The run folder the configured logger would create: its ``version`` if set, else the next ``version_N``."""
    folder = runs_folder(trainer)
    if folder is None:
        return None
    logger = trainer.get("logger")
    init = logger.get("init_args") if isinstance(logger, Namespace) else None
    version = init.get("version") if init is not None else None
    if version is None:
        version = next_version(folder)
    return folder / (version if isinstance(version, str) else f"version_{version}")


def next_version(folder: Path) -> int:
    """The N of the next ``version_N`` under ``folder``, as Lightning's loggers number their runs."""
    return max((version_number(p) for p in folder.glob("version_*") if p.is_dir()), default=-1) + 1


def one_folder_per_run(trainer: Namespace) -> list[Namespace]:
    """Loggers of a list that share a folder (save_dir and name) and leave the version to Lightning log into one
    ``version_N``: each would number its run itself (TensorBoard version_0, CSV version_1), and the checkpoints
    would go into one of them and ``--ckpt_path last`` look in the other. Returns the ``init_args`` given one."""
    loggers, shared = trainer.get("logger"), {}
    for each in loggers if isinstance(loggers, list) else []:
        init = each.get("init_args") if isinstance(each, Namespace) else None
        if init is not None and "version" in init and init.get("version") is None:
            folder = runs_folder(Namespace(logger=each, default_root_dir=trainer.get("default_root_dir")))
            shared.setdefault(folder, []).append(init)
    shared = {folder: inits for folder, inits in shared.items() if folder is not None and len(inits) > 1}
    for folder, inits in shared.items():
        for init in inits:
            init.version = next_version(folder)
    return [init for inits in shared.values() for init in inits]


def newest_config_runs(base: Path, which: str) -> Path:
    """The one folder under ``base`` (lightning_logs) that holds ``version_N`` runs: ``base/<name>`` of a config
    with a logger name, or ``base`` itself. None, or several names, is a GptLitError: which runs is ambiguous."""
    runs = [p for pattern in ("version_*", "*/version_*") for p in base.glob(pattern) if p.is_dir()]
    folders = sorted({run.parent for run in runs})
    if not folders:
        raise nothing_to_read(which, f"no run in {base}", config_given=False)
    if len(folders) > 1:
        names = [f.name for f in folders if f != base]
        raise GptLitError(
            f"--ckpt_path {which} without --config: {base} holds the runs of {len(folders)} configs "
            f"({', '.join(names)}{', and unnamed ones' if base in folders else ''}); say whose with --config "
            f"(e.g. --config {names[0]}) or give a checkpoint's path"
        )
    return folders[0]


def run_config(subcommand: str | None, config: Namespace) -> tuple[str, str] | None:
    """For validate/test/predict/export given a ``--ckpt_path`` and no ``--config`` (``config``: the options given):
    the checkpoint's run's own ``config.yaml``, and the checkpoint's path; None otherwise, or for a checkpoint
    outside a run folder.

    ``last`` and ``best`` without a config are the newest run's, in lightning_logs/ (under
    ``--trainer.default_root_dir`` when given) where the default logger and every shipped config keep their
    runs; when it holds the runs of several configs, ``--config`` must say whose (a GptLitError)."""
    ckpt = config.get("ckpt_path")
    if subcommand not in READING_SUBCOMMANDS or config.get("config") or not ckpt:
        return None
    if ckpt in ("last", "best"):
        local_folders(config.trainer)  # a "~" or file:// default_root_dir as the folder it names
        base = Path(config.trainer.get("default_root_dir") or ".") / DEFAULT_LOGS
        path = latest_checkpoint(newest_config_runs(base, ckpt), ckpt, bool(config.get("trust_checkpoint")))
        run = run_of(path)
        if run is None or not (run / "config.yaml").is_file():
            raise GptLitError(f"--ckpt_path {ckpt}: the run of {path} has no config.yaml; add --config")
    else:
        path, run = ckpt, run_of(ckpt)
        if run is None or not (run / "config.yaml").is_file():
            return None
    return str(run / "config.yaml"), path
