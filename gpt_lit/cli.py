"""``python -m gpt_lit {fit,validate,test,predict,export}``: LightningCLI over GPTLightning and TimeMachineData.

Every mistake a user can fix ends the same way: one line on stderr starting with ``error:``, exit code 2,
no traceback. Ctrl-C or SIGTERM during ``fit`` saves ``last.ckpt`` and prints how to resume.

``--config residual`` names a shipped config (from any folder, after any install); a path that exists wins.
Every ``fit`` keeps ``last.ckpt`` the newest state it can resume from exactly (atomically; see
gpt_lit/callbacks/last_checkpoint.py and gpt_lit/checkpointing.py), unless ``--trainer.enable_checkpointing false``.
``--ckpt_path last`` / ``best`` in a new process use the newest run of the config's name; validate, test,
predict and export without ``--config`` use the checkpoint's run's own config.yaml (runs.with_run_config).
``test`` and ``predict`` on a run's checkpoint write into that run's folder. ``export`` writes a Hugging Face
GPT-2 folder (gpt_lit/export.py). Every checkpoint
is loaded as data (``weights_only``; see gpt_lit/checkpoint_reading.py); ``--trust_checkpoint true`` loads a
trusted file that needs more.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import lightning.pytorch as pl
import yaml
from jsonargparse import ActionConfigFile
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from gpt_lit.callbacks.finite_loss import FiniteLoss
from gpt_lit.callbacks.last_checkpoint import LastCheckpoint
from gpt_lit.callbacks.rng_state import RNGState
from gpt_lit.checkpoint_reading import TRUST_HELP, TRUST_OPTION, check_architecture, read_checkpoint, refusal
from gpt_lit.checkpoint_thread import BackgroundCheckpointIO
from gpt_lit.checkpointing import AtomicCheckpointIO
from gpt_lit.console import quiet_console, use_quiet_progress_bar, use_quiet_summary
from gpt_lit.data import TimeMachineData
from gpt_lit.error_source import where_from
from gpt_lit.errors import GptLitError, about_the_configuration, fail, one_line, short_type_error
from gpt_lit.export import ExportingTrainer
from gpt_lit.module import GPTLightning
from gpt_lit.pretrained import fetch
from gpt_lit.runs import (
    LIGHTNING_CKPT_NAMES,
    PROG,
    checkpoints_dirpath,
    continue_run,
    latest_checkpoint,
    log_beside_run,
    runs_folder,
    with_run_config,
)
from gpt_lit.shipped_configs import shipped_configs, with_shipped_configs
from gpt_lit.tokenizer import vocab_size

# The arguments of the command being parsed (main() sets them), to say where a bad key or value came from.
_COMMAND_LINE: list[str] = []
# The --ckpt_path given, for the refusal of one only Lightning reads (a URL, hpc, registry)
_CKPT_PATH: str | None = None


# The model's keys that come from the data (linked): (the data's key, the model's key).
LINKS = (("data.context_length", "model.config.context_length"), ("data.tokenizer", "model.config.vocab_size"))


def refuse_linked_keys_in_configs(parser: LightningArgumentParser, args: Sequence[str]) -> None:
    """A config file that sets a link's target gets the parser's error for it on the command line: jsonargparse
    refuses ``--model.config.context_length`` there, but from a config file it would drop the value silently."""
    args = [part for arg in args for part in (arg.split("=", 1) if arg.startswith(("--config=", "-c=")) else [arg])]
    missing = object()
    for option, path in zip(args, args[1:], strict=False):
        if option not in ("--config", "-c"):
            continue
        try:
            config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not a readable YAML file: the parser says so
        for source, target in LINKS:
            node: Any = config
            for part in target.split("."):
                node = node.get(part, missing) if isinstance(node, dict) else missing
            if node is not missing:  # given, even as null
                parser.error(f'Linked "{target}" must be given via "{source}".')


class GPTLitParser(LightningArgumentParser):
    """jsonargparse's parser, but a bad argument or config key prints one ``error:`` line instead of the usage,
    naming the YAML file and line, or the command-line option, it came from."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse is trying alternatives internally: let it
            super().error(message, ex)
        source = where_from(one_line(message), with_shipped_configs(_COMMAND_LINE))  # a config named, as its file
        if " is not valid YAML: " in source or " is not a config: " in source:
            fail(source)
        fail(f"{short_type_error(one_line(message))} ({source + '; ' if source else ''}--help lists the options)")


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


class GPTLitCLI(LightningCLI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        quiet_console()
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # Lightning's four, and `export` (ExportingTrainer.export): LightningCLI makes a subcommand of each
        # trainer method listed here, with the arguments it does not skip.
        return {**LightningCLI.subcommands(), "export": {"model", "datamodule"}}

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
        if args is None or isinstance(args, list):  # the command line (or main's list): look up --config names,
            # and a checkpoint's run's own config.yaml when validate/test/predict/export get none
            args = with_shipped_configs(with_run_config(list(sys.argv[1:] if args is None else args)))
            refuse_linked_keys_in_configs(parser, args)
            self.config = parser.parse_args(args)
        else:
            super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The model's position table and vocabulary come from the data, so the two can never disagree.
        (context, context_target), (tokenizer, tokenizer_target) = LINKS
        parser.link_arguments(context, context_target)
        parser.link_arguments(tokenizer, tokenizer_target, compute_fn=vocab_size)
        parser.add_argument("--trust_checkpoint", type=bool, default=False, help=TRUST_HELP)

    def _parse_ckpt_path(self) -> None:
        # Lightning's version loads the checkpoint's hyperparameters over the parsed config, which silently
        # overrides --model.* options (max_new_tokens, temperature, the architecture). Here the config decides;
        # the checkpoint is only read, so a missing or broken file fails now, and one that does not fit the
        # configured model fails in before_<subcommand>.
        # Every checkpoint is loaded as data (checkpoint_reading.py): read here with weights_only=True, so one that
        # would run code is refused before any of it runs, and restored by Lightning with weights_only=True too,
        # unless --trust_checkpoint and the file needs it. Lightning's own --weights_only stays parseable (every
        # run's config.yaml has `weights_only: null`) but is not a second switch.
        global _CKPT_PATH
        self.checkpoint: dict[str, Any] | None = None
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        trust, config.trust_checkpoint = bool(config.get("trust_checkpoint")), False  # per command, not in config.yaml
        if config.get("weights_only") is False:
            raise GptLitError(f"--weights_only false: to load a checkpoint you trust as code, use {TRUST_OPTION}")
        self.weights_only = not trust  # what Lightning's restore gets (True unless trusted and needed)
        path = _CKPT_PATH = config.get("ckpt_path")
        if path in ("last", "best"):  # in a new process: the latest run of this config's name
            path = latest_checkpoint(runs_folder(config.trainer), path, trust, checkpoints_dirpath(config.trainer))
            config.ckpt_path = path
        if path and path not in LIGHTNING_CKPT_NAMES and "://" not in path:
            self.checkpoint, needed_trust = read_checkpoint(path, trust)
            self.weights_only = not needed_trust

    def before_instantiate_classes(self) -> None:
        if self.subcommand in ("test", "predict"):
            log_beside_run(self.config[self.subcommand], self.subcommand)
        if self.subcommand == "fit":
            continue_run(self.config["fit"])
        # model.init_from is fetched (a hub name downloaded, or its one error line) before the model is built: the
        # random initialisation of GPT-2 124M alone takes seconds, wasted when the download fails. Process 0 only,
        # as nothing is shared yet; GPTLightning.prepare_data still fetches on each node, from the cache by then.
        config = self.config[self.subcommand] if self.subcommand else None
        if config and config.get("model.init_from") and not config.get("ckpt_path") and rank_zero_only.rank == 0:
            fetch(config.get("model.init_from"))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = self._get(self.config_init, "trainer", default={})
        callbacks = config.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        if self.subcommand != "fit" or config.get("enable_checkpointing") is False:
            # Off means off: the config's checkpoint callbacks too. validate/test/predict save nothing; without
            # them no ModelCheckpoint reloads its state from the checkpoint and warns that its dirpath changed.
            callbacks = [cb for cb in callbacks if not isinstance(cb, Checkpoint)]
            kwargs["enable_checkpointing"] = False
        else:
            callbacks.append(LastCheckpoint())  # last.ckpt, whatever checkpoint callbacks the config lists
        # Atomic saves on a thread beside training, whatever --trainer.plugins the user gives (unless it is a
        # CheckpointIO of their own); AsyncCheckpointIO without a CheckpointIO to wrap wraps the atomic one.
        plugins = config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list) else [plugins]
        for plugin in plugins:
            if isinstance(plugin, AsyncCheckpointIO) and plugin.checkpoint_io is None:
                plugin.checkpoint_io = AtomicCheckpointIO()
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(BackgroundCheckpointIO(AtomicCheckpointIO()))
        trainer = super().instantiate_trainer(**{"callbacks": callbacks, "plugins": plugins, **kwargs})
        use_quiet_summary(trainer)
        use_quiet_progress_bar(trainer)
        return trainer

    def _check_inputs(self) -> None:
        self._check_checkpoint()
        check_writable(self.trainer)
        if self.subcommand == "fit" and self.config["fit"].get("ckpt_path"):  # a resume: keep the CSV's old rows
            for callback in self.trainer.callbacks:
                if isinstance(callback, LastCheckpoint):
                    callback.read_csv_logs(self.trainer)

    def before_export(self) -> None:
        self._check_checkpoint()  # nothing is logged: export writes only to --out

    def _check_checkpoint(self) -> None:
        # With a checkpoint, its weights replace model.init_from's: a run's config.yaml keeps init_from, and
        # test/predict/resume on it must neither download nor need the released weights again.
        self.model.weights_from_checkpoint = bool(self.config[self.subcommand].get("ckpt_path"))
        if self.checkpoint is not None:
            check_architecture(self.config[self.subcommand].ckpt_path, self.checkpoint, self.model)
            if self.subcommand == "fit":  # a mid-epoch resume that would reorder the epoch: before anything is written
                data_state = self.checkpoint.get(type(self.datamodule).__qualname__, {})
                self.datamodule.check_resume(data_state, self.config[self.subcommand].ckpt_path)
            self.checkpoint = None  # Lightning loads it again itself
        self.config_init[self.subcommand].weights_only = self.weights_only  # passed to Trainer.<subcommand>

    before_fit = before_validate = before_test = before_predict = _check_inputs

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except SystemExit as e:  # Lightning ends Ctrl-C with sys.exit(1) and SIGTERM with a SIGTERMException
            if self.trainer.state.status != TrainerStatus.INTERRUPTED:
                raise
            # LastCheckpoint stops a first Ctrl-C as SIGTERM (after the step); it knows which it was.
            stoppers = [cb.stopped_by for cb in self.trainer.callbacks if isinstance(cb, LastCheckpoint)]
            by = stoppers[0] if stoppers else "SIGTERM" if isinstance(e, SIGTERMException) else "Ctrl-C"
            if rank_zero_only.rank == 0:
                print(f"error: {subcommand} stopped by {by}{self._how_to_resume()}", file=sys.stderr)
            sys.exit(143 if by == "SIGTERM" else 130)

    def _how_to_resume(self) -> str:
        # From what LastCheckpoint read at setup: trainer.log_dir is a broadcast, and after a stop another process
        # may have ended already.
        last = next((cb for cb in self.trainer.callbacks if isinstance(cb, LastCheckpoint)), None)
        if last is None or not last.saved_path:
            return "; no checkpoint was saved yet: start it again"
        config = os.path.join(last.log_dir or "", "config.yaml")
        command = "python -m gpt_lit fit" + (f" --config {config}" if os.path.isfile(config) else " <same arguments>")
        command += f" --ckpt_path {last.saved_path}"
        if isinstance(self.trainer.logger, TensorBoardLogger) and len(self.trainer.loggers) == 1:  # the same run
            # (several loggers go on in the checkpoint's run folder by themselves: runs.continue_run)
            command += f" --trainer.logger.init_args.version {last.logger_version}"
        return f"; resume with: {command}"


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
            trainer_class=ExportingTrainer,
            args=args,
            parser_class=GPTLitParser,
            save_config_kwargs={"overwrite": True},
            # Always on, whatever the config: stop at a NaN loss, exact resumes (and LastCheckpoint, in fit).
            trainer_defaults={"callbacks": [FiniteLoss(), RNGState(), *extra_callbacks]},
            parser_kwargs={"description": "Train, evaluate, run and export the GPT of 'The transformer block'."},
        )
    except (GptLitError, MisconfigurationException) as e:
        fail(e)
    except pickle.UnpicklingError as e:  # weights_only refused a checkpoint that Lightning, not the CLI, reads
        fail(refusal(_CKPT_PATH or "--ckpt_path", e))
    except KeyboardInterrupt:  # Ctrl-C outside fit/test/predict (while loading, parsing, ...)
        if rank_zero_only.rank == 0:
            print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        if isinstance(e, (ValueError, TypeError)) and about_the_configuration(e):
            fail(e)
        traceback.print_exc()
        command = " ".join(["python -m gpt_lit", *_COMMAND_LINE])
        print(f"error: unexpected {type(e).__name__} (a bug, not your input) while running: {command}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
