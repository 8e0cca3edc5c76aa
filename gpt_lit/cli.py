"""``python -m gpt_lit {fit,validate,test,predict}``: LightningCLI over GPTLightning and TimeMachineData.

Every mistake a user can fix ends the same way: one line on stderr starting with ``error:``, exit code 2,
no traceback. Ctrl-C or SIGTERM during ``fit`` saves ``interrupted.ckpt`` and prints how to resume.

``--config residual`` names a shipped config (from any folder, after any install); a path that exists wins.
Every ``fit`` saves ``last.ckpt`` after each epoch (atomically; see gpt_lit/checkpointing.py), unless
``--trainer.enable_checkpointing false``. ``--ckpt_path last`` / ``best`` in a new process use the latest run of
the config's name. ``test`` and ``predict`` on a run's checkpoint write into that run's folder.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import lightning.pytorch as pl
import torch
from jsonargparse import ActionConfigFile, Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from gpt_lit.callbacks.finite_loss import FiniteLoss
from gpt_lit.callbacks.interrupt import InterruptCheckpoint
from gpt_lit.callbacks.rng_state import RNGState
from gpt_lit.checkpointing import AtomicCheckpointIO, EpochCheckpoint
from gpt_lit.config_sources import where_from
from gpt_lit.console import quiet_console, use_quiet_summary
from gpt_lit.data import TimeMachineData
from gpt_lit.errors import GptLitError
from gpt_lit.module import GPTLightning
from gpt_lit.tokenizer import vocab_size

PROG = "python -m gpt_lit"

# ckpt_path values Lightning resolves itself rather than reading a file
LIGHTNING_CKPT_NAMES = {"last", "best", "hpc", "registry"}
# where each GPTConfig field is set on the command line (two come from the data module, linked)
CONFIG_KEYS = {"context_length": "data.context_length", "vocab_size": "vocab_size (from data.tokenizer)"}


def one_line(message: object) -> str:
    return " ".join(str(message).split())


def fail(message: object) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr (once, from process 0) and exit with status 2."""
    if rank_zero_only.rank == 0:
        print(f"error: {one_line(message)}", file=sys.stderr)
    sys.exit(2)


def short_type_error(message: str) -> str:
    """jsonargparse's "Parser key "k": ... <class 'int'> ... Given value: x" as "k: expected int, got 'x'"."""
    key = re.match(r'Parser key "([^"]+)":', message)
    value = re.search(r"(?:Given|Got) value: (.*?)\s*$", message, re.S)
    expected = message.split("Given value type")[0]  # not the type of what was given
    types = list(dict.fromkeys(re.findall(r"<class '(\w+)'>", expected)))
    if not (key and value and types) or not set(types) <= {"int", "float", "str", "bool", "NoneType"}:
        return message
    names = " or ".join("null" if t == "NoneType" else t for t in types)
    return f"{key[1]}: expected {names}, got {value[1]!r}"


# The arguments of the command being parsed (main() sets them), to say where a bad key or value came from.
_COMMAND_LINE: list[str] = []


class GPTLitParser(LightningArgumentParser):
    """jsonargparse's parser, but a bad argument or config key prints one ``error:`` line instead of the usage,
    naming the YAML file and line, or the command-line option, it came from."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse is trying alternatives internally: let it
            super().error(message, ex)
        source = where_from(one_line(message), with_shipped_configs(_COMMAND_LINE))  # a config named, as its file
        if " is not valid YAML: " in source:
            fail(source)
        fail(f"{short_type_error(one_line(message))} ({source + '; ' if source else ''}--help lists the options)")


def _config_fields(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config) if isinstance(config, dict) else {}


def read_checkpoint(path: str) -> dict[str, Any]:
    """The checkpoint at ``path`` (memory-mapped, so cheap); a GptLitError when it is missing or unreadable."""
    file = Path(path)
    if not file.exists():
        raise GptLitError(f"checkpoint {path} does not exist")
    if not file.is_file():
        raise GptLitError(f"checkpoint {path} is a directory, not a .ckpt file")
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # a truncated zip, a text file, a pickle of something else: all unreadable here
        reason = one_line(e).split(". ")[0] or type(e).__name__
        raise GptLitError(f"{path} is not a readable checkpoint: truncated, or not a PyTorch file ({reason})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise GptLitError(f"{path} is a PyTorch file but not a Lightning checkpoint (it has no state_dict)")
    return ckpt


def check_architecture(path: str, ckpt: dict[str, Any], model: LightningModule) -> None:
    """Raise a GptLitError naming the differing GPTConfig fields and tensor shapes, if there are any."""
    # Which GPTConfig fields differ (dropout does not change the architecture), then which tensors.
    theirs = _config_fields((ckpt.get("hyper_parameters") or {}).get("config"))
    ours = _config_fields(model.hparams.get("config"))
    details = [
        f"{CONFIG_KEYS.get(k, f'model.config.{k}')} is {theirs[k]!r} in the checkpoint but {ours[k]!r} here"
        for k in ours
        if k in theirs and k != "dropout" and theirs[k] != ours[k]
    ]
    saved, wanted = ckpt["state_dict"], model.state_dict()
    shapes = [
        f"{k} {list(saved[k].shape)} vs {list(v.shape)}"
        for k, v in wanted.items()
        if k in saved and saved[k].shape != v.shape
    ]
    missing = [k for k in wanted if k not in saved]
    unexpected = [k for k in saved if k not in wanted]
    if shapes:
        details.append("shapes differ: " + ", ".join(shapes[:3]) + (", ..." if len(shapes) > 3 else ""))
    if missing:
        details.append(f"{len(missing)} tensors missing from the checkpoint (e.g. {missing[0]})")
    if unexpected:
        details.append(f"{len(unexpected)} tensors the model does not have (e.g. {unexpected[0]})")
    if not details:
        return
    run_config = Path(path).parent.parent / "config.yaml"  # <run>/checkpoints/last.ckpt -> <run>/config.yaml
    hint = f"; use the run's own config: --config {run_config}" if run_config.is_file() else ""
    raise GptLitError(f"checkpoint {path} is of a different architecture than the config: {'; '.join(details)}{hint}")


def check_writable(trainer: Trainer) -> None:
    """Raise a GptLitError unless the folder the logs and checkpoints go to can be written."""
    folders = [logger.save_dir for logger in trainer.loggers if logger.save_dir] or [trainer.default_root_dir]
    for folder in folders:
        try:
            os.makedirs(folder, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            raise GptLitError(
                f"cannot write to the log directory {folder} ({e.strerror or e}); choose another with "
                f"--trainer.logger.init_args.save_dir (or --trainer.default_root_dir without a logger)"
            ) from None


def configs_dir() -> Path:
    """The shipped configs: ``gpt_lit/configs`` in an installed wheel, ``configs/`` at the top of a checkout."""
    package = Path(__file__).resolve().parent
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


def shipped_configs() -> dict[str, Path]:
    """The shipped configs by name (``residual``, ``no_residual_8``, ...)."""
    return {path.stem: path for path in sorted(configs_dir().glob("*.yaml"))}


def find_config(value: str) -> str:
    """``--config``'s value as a file: an existing path as given, else the shipped config of that name.

    ``residual``, ``residual.yaml`` and ``configs/residual.yaml`` all name the shipped ``residual.yaml``.
    Anything else that is not a file (inline YAML, a path in another folder) is left to the parser.
    """
    if Path(value).exists() or not re.fullmatch(r"(configs/)?[\w.-]+", value):
        return value
    name = Path(value).name.removesuffix(".yaml").removesuffix(".yml")
    configs = shipped_configs()
    if name in configs:
        return str(configs[name])
    raise GptLitError(
        f"--config {value}: no such file, and no shipped config of that name; the shipped configs are "
        f"{', '.join(configs)} (give one of these names, or a config file's path)"
    )


def with_shipped_configs(args: list[str]) -> list[str]:
    """``args`` with every ``--config``/``-c`` value replaced by ``find_config``'s answer."""
    out, args = [], list(args)
    for i, arg in enumerate(args):
        if i and args[i - 1] in ("--config", "-c"):
            arg = find_config(arg)
        elif arg.startswith(("--config=", "-c=")):
            option, value = arg.split("=", 1)
            arg = f"{option}={find_config(value)}"
        out.append(arg)
    return out


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


def latest_checkpoint(folder: Path | None, which: str) -> str:
    """``last.ckpt`` (which="last") or the best checkpoint (which="best") of the newest run under ``folder``."""
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
    states = read_checkpoint(str(last)).get("callbacks", {}).values()
    best = [s["best_model_path"] for s in states if isinstance(s, dict) and s.get("best_model_path")]
    if not best or not (last.parent / Path(best[0]).name).is_file():
        raise GptLitError(
            f"--ckpt_path best: the latest run, {last.parent.parent}, keeps no best checkpoint (its config has no "
            f"ModelCheckpoint with a monitor, or the file is gone); use --ckpt_path last or a checkpoint's path"
        )
    return str(last.parent / Path(best[0]).name)


class GPTLitCLI(LightningCLI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        quiet_console()
        super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        kwargs.setdefault("dump_header", [f"lightning.pytorch=={pl.__version__}"])
        kwargs.setdefault("prog", PROG)
        parser = self.parser_class(**kwargs)
        names = ", ".join(shipped_configs())
        parser.add_argument(
            "-c", "--config", action=ActionConfigFile,
            help=f"A YAML config: a file's path, or the name of a shipped config ({names}; '.yaml' optional). "
            "A path that exists wins over a name.",
        )  # fmt: skip
        return parser

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        if args is None or isinstance(args, list):  # the command line (or main's list): look up --config names
            self.config = parser.parse_args(with_shipped_configs(sys.argv[1:] if args is None else args))
        else:
            super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The model's position table and vocabulary come from the data, so the two can never disagree.
        parser.link_arguments("data.context_length", "model.config.context_length")
        parser.link_arguments("data.tokenizer", "model.config.vocab_size", compute_fn=vocab_size)

    def _parse_ckpt_path(self) -> None:
        # Lightning's version loads the checkpoint's hyperparameters over the parsed config, which silently
        # overrides --model.* options (max_new_tokens, temperature, the architecture). Here the config decides;
        # the checkpoint is only read, so a missing or broken file fails now, and one that does not fit the
        # configured model fails in before_<subcommand>.
        self.checkpoint: dict[str, Any] | None = None
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if path in ("last", "best"):  # in a new process: the latest run of this config's name
            path = latest_checkpoint(runs_folder(self.config[subcommand].trainer), path)
            self.config[subcommand].ckpt_path = path
        if path and path not in LIGHTNING_CKPT_NAMES and "://" not in path:
            self.checkpoint = read_checkpoint(path)

    def before_instantiate_classes(self) -> None:
        # test and predict on <run>/checkpoints/X.ckpt log into <run>/<test|predict>/X/, beside what they evaluate
        subcommand = self.subcommand
        run = run_of(self.config[subcommand].get("ckpt_path")) if subcommand in ("test", "predict") else None
        logger = self.config[subcommand].trainer.get("logger") if run else None
        init = logger.get("init_args") if isinstance(logger, Namespace) else None
        if init is not None and "save_dir" in init:
            init.save_dir, init.name = str(run), subcommand
            init.version = Path(self.config[subcommand].ckpt_path).stem

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = self._get(self.config_init, "trainer", default={})
        callbacks = config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        defaults = self.trainer_defaults.get("callbacks", [])
        if config.get("enable_checkpointing") is False:  # off means off: ours and the config's
            callbacks = [cb for cb in callbacks if not isinstance(cb, Checkpoint)]
            defaults = [cb for cb in defaults if not isinstance(cb, Checkpoint)]
            self.trainer_defaults = {**self.trainer_defaults, "callbacks": defaults}
        elif not any(isinstance(cb, ModelCheckpoint) for cb in [*callbacks, *defaults]):
            callbacks.append(EpochCheckpoint(save_top_k=0))  # a config without one still saves last.ckpt every epoch
        # Atomic saves, whatever --trainer.plugins the user gives (unless it is a CheckpointIO of their own).
        plugins = config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())
        trainer = super().instantiate_trainer(**{"callbacks": callbacks, "plugins": plugins, **kwargs})
        use_quiet_summary(trainer)
        return trainer

    def _check_inputs(self) -> None:
        # With a checkpoint, its weights replace model.init_from's: a run's config.yaml keeps init_from, and
        # test/predict/resume on it must neither download nor need the released weights again.
        self.model.weights_from_checkpoint = bool(self.config[self.subcommand].get("ckpt_path"))
        if self.checkpoint is not None:
            check_architecture(self.config[self.subcommand].ckpt_path, self.checkpoint, self.model)
            self.checkpoint = None  # Lightning loads it again itself
        check_writable(self.trainer)

    before_fit = before_validate = before_test = before_predict = _check_inputs

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except SystemExit as e:  # Lightning ends Ctrl-C with sys.exit(1) and SIGTERM with a SIGTERMException
            if self.trainer.state.status != TrainerStatus.INTERRUPTED:
                raise
            # InterruptCheckpoint stops a first Ctrl-C as SIGTERM (after the step); it knows which it was.
            stoppers = [cb.stopped_by for cb in self.trainer.callbacks if isinstance(cb, InterruptCheckpoint)]
            by = stoppers[0] if stoppers else "SIGTERM" if isinstance(e, SIGTERMException) else "Ctrl-C"
            if rank_zero_only.rank == 0:
                print(f"error: {subcommand} stopped by {by}{self._how_to_resume()}", file=sys.stderr)
            sys.exit(143 if by == "SIGTERM" else 130)

    def _how_to_resume(self) -> str:
        saved = [cb.saved_path for cb in self.trainer.callbacks if isinstance(cb, InterruptCheckpoint)]
        saved = [path for path in saved if path]
        if not saved:
            return ""
        config = os.path.join(self.trainer.log_dir or "", "config.yaml")
        command = "python -m gpt_lit fit" + (f" --config {config}" if os.path.isfile(config) else " <same arguments>")
        command += f" --ckpt_path {saved[0]}"
        if isinstance(self.trainer.logger, TensorBoardLogger):  # continue in the same TensorBoard run
            command += f" --trainer.logger.init_args.version {self.trainer.logger.version}"
        return f"; resume with: {command}"


def _about_the_configuration(e: BaseException) -> bool:
    """Whether ``e`` says a configured value was refused: raised while the CLI read the configuration and built
    the objects (GPTConfig's checks), or raised by Lightning itself checking its settings while running."""
    frames = traceback.extract_tb(e.__traceback__)
    names = {frame.name for frame in frames}
    configuring = "_run_subcommand" not in names and bool(names & {"parse_arguments", "instantiate_classes"})
    return configuring or bool(frames) and f"{os.sep}lightning{os.sep}" in frames[-1].filename


def main(args: list[str] | None = None, extra_callbacks: Sequence[Callback] = ()) -> GPTLitCLI:
    """``python -m gpt_lit``; ``args`` instead of the command line, ``extra_callbacks`` added to every run.

    A mistake in the input (GptLitError, Lightning's MisconfigurationException, a bad value found while the
    configuration is read) ends with one ``error:`` line and status 2; anything else is a bug: its traceback,
    then a line saying what was running, status 1.
    """
    global _COMMAND_LINE
    _COMMAND_LINE = list(sys.argv[1:] if args is None else args)
    try:
        return GPTLitCLI(
            GPTLightning,
            TimeMachineData,
            args=args,
            parser_class=GPTLitParser,
            save_config_kwargs={"overwrite": True},
            # Always on, whatever the config: stop at a NaN loss, save on Ctrl-C/SIGTERM, exact resumes.
            trainer_defaults={"callbacks": [FiniteLoss(), InterruptCheckpoint(), RNGState(), *extra_callbacks]},
            parser_kwargs={"description": "Train, evaluate and run the GPT of 'The transformer block'."},
        )
    except (GptLitError, MisconfigurationException) as e:
        fail(e)
    except KeyboardInterrupt:  # Ctrl-C outside fit/test/predict (while loading, parsing, ...)
        if rank_zero_only.rank == 0:
            print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        if isinstance(e, (ValueError, TypeError)) and _about_the_configuration(e):
            fail(e)
        traceback.print_exc()
        command = " ".join(["python -m gpt_lit", *_COMMAND_LINE])
        print(f"error: unexpected {type(e).__name__} (a bug, not your input) while running: {command}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
