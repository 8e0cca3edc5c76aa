"""``python -m gpt_lit {fit,validate,test,predict,export}``: LightningCLI over GPTLightning and TimeMachineData; a
mistake a user can fix ends with one ``error:`` line and status 2, a stop of ``fit`` with how to resume."""

import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import Callback, Trainer, __version__
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from gpt_lit.data import TimeMachineData
from gpt_lit.errors import GptLitError, check_accelerator, fail, raised_by_lightning
from gpt_lit.hub.export import ExportingTrainer
from gpt_lit.hub.pretrained import fetch
from gpt_lit.module import GPTLightning
from gpt_lit.prompts import read_prompts
from gpt_lit.run.callbacks import FiniteLoss, RNGState
from gpt_lit.run.checkpoints import TRUST_HELP, AtomicCheckpointIO, BackgroundCheckpointIO, check_architecture, refusal
from gpt_lit.run.console import quiet_callbacks, quiet_console
from gpt_lit.run.folders import PROG, continue_run, listed, local_folders, log_beside_run, make_plan, one_folder_per_run
from gpt_lit.run.last_checkpoint import LastCheckpoint
from gpt_lit.run.parser import LINKS, ConfigFile, GPTLitParser, shipped_configs
from gpt_lit.tokenizer import vocab_size


class GPTLitCLI(LightningCLI):
    """LightningCLI with the run plan made as the command line is parsed; a stop ends with how to resume."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("args")
        self.command_line = tuple(sys.argv[1:] if given is None else given if isinstance(given, list) else ())
        kwargs.setdefault("parser_class", GPTLitParser)
        self.read: list[str] = []  # the config files the parsers read
        self.plan = None  # folders.RunPlan, made as the command line is parsed
        self.last_checkpoint: LastCheckpoint | None = None  # fit's, made in instantiate_trainer
        self.versioned: list[Any] = []  # loggers' init_args given this run's version (one_folder_per_run)
        quiet_console()
        try:  # LightningCLI runs the subcommand inside its __init__: its stops are caught around it
            super().__init__(*args, **kwargs)
        except SystemExit as e:  # Lightning ends Ctrl-C with sys.exit(1) and SIGTERM with a SIGTERMException
            self.stopped(e)
        except pickle.UnpicklingError as e:  # weights_only refused a checkpoint that Lightning, not the plan, read
            raise GptLitError(refusal((self.plan and self.plan.ckpt_path) or "--ckpt_path", e)) from None

    def subcommands(self) -> dict[str, set[str]]:
        """Lightning's four and ``export``: only the one named, as jsonargparse builds each (slow) parser first."""
        every = {**LightningCLI.subcommands(), "export": {"model", "datamodule"}}
        named = self.command_line[0] if self.command_line else None
        return {named: every[named]} if named in every else every

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        kwargs.setdefault("dump_header", [f"lightning.pytorch=={__version__}"])
        kwargs.setdefault("prog", PROG)
        kwargs.setdefault("allow_abbrev", False)  # `--model.config.n_layer` is a typo, not `--model.config.n_layers`
        parser = self.parser_class(read=self.read, **kwargs)
        parser.add_argument("-c", "--config", action=ConfigFile, help="A YAML config: a file's path, or the name of a "
                            f"shipped config ({', '.join(shipped_configs())}; '.yaml' optional). A path that exists "
                            "wins over a name.")  # fmt: skip
        return parser

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        if subcommand == "predict":  # the prompts, before anything is read, built or written
            read_prompts(config.get("data.prompts"), config.get("data.prompts_file"))
        elif config.get("model.inspect"):
            raise GptLitError(f"model.inspect is for predict (a page for each prompt), not {subcommand}: leave it out")
        check_accelerator(config.get("trainer.accelerator"))  # before the seed is set and the model built
        local_folders(config.trainer)  # before the plan looks for a run in them
        self.plan = make_plan(config)
        config.trust_checkpoint = False  # given per command, not recorded in config.yaml
        config.ckpt_path = None  # else LightningCLI loads its hyperparameters over --model.*; put back resolved below

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for (source, target), compute_fn in zip(LINKS, (None, vocab_size), strict=True):
            parser.link_arguments(source, target, compute_fn=compute_fn)
        parser.add_argument("--trust_checkpoint", type=bool, default=False, help=TRUST_HELP)

    def before_instantiate_classes(self) -> None:
        plan = self.plan
        if plan is None:
            return
        config = self.config[self.subcommand]
        config.ckpt_path = plan.ckpt_path  # "last"/"best" resolved: config.yaml names the file
        if self.subcommand in ("validate", "test", "predict"):
            log_beside_run(config, self.subcommand, plan.ckpt_path, plan.run)
        if self.subcommand == "fit":
            continue_run(config, plan.run)  # a resume: each logger in the run's folder
            self.versioned = one_folder_per_run(config.trainer)  # a new run: loggers of one folder, one version_N
        # model.init_from fetched (or its error line) on process 0, before the slow build of the model
        if config.get("model.init_from") and not plan.ckpt_path and rank_zero_only.rank == 0:
            fetch(config.get("model.init_from"))

    def instantiate_classes(self) -> None:
        try:  # a value GPTConfig or the Trainer refuses is the configuration's
            super().instantiate_classes()
        except (ValueError, TypeError) as e:
            raise GptLitError(e) from None

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        for init in self.versioned:  # the loggers are made: config.yaml keeps null, so a fit from it is a new run
            init.version = None
        self.datamodule.check_inputs(self.subcommand)  # the book, the prompts: before the Trainer says a word
        config = (self.config_init[self.subcommand] if self.subcommand else self.config_init).get("trainer") or {}
        callbacks, plugins = (listed(config.get(key)) for key in ("callbacks", "plugins"))
        if self.subcommand != "fit" or config.get("enable_checkpointing") is False:
            # off means the config's checkpoint callbacks too (else one reloads its state and warns of its dirpath)
            callbacks = [cb for cb in callbacks if not isinstance(cb, Checkpoint)]
            kwargs["enable_checkpointing"] = False
        else:
            self.last_checkpoint = LastCheckpoint()
            callbacks.append(self.last_checkpoint)
        callbacks.append(FiniteLoss())
        # Atomic saves on a thread beside training, unless --trainer.plugins gives a CheckpointIO that writes
        if not any(isinstance(p, CheckpointIO) and getattr(p, "checkpoint_io", p) for p in plugins):
            plugins = [p for p in plugins if not isinstance(p, CheckpointIO)] + [
                BackgroundCheckpointIO(AtomicCheckpointIO())]  # fmt: skip
        callbacks += quiet_callbacks(config, callbacks)  # in place of Lightning's default bar and summary
        return super().instantiate_trainer(**{"callbacks": callbacks, "plugins": plugins, **kwargs})

    def check_checkpoint(self) -> None:
        """The plan's checkpoint fits the model (and a resume the data's order); Lightning loads it as planned."""
        plan = self.plan
        assert plan is not None
        if plan.shapes is not None and plan.ckpt_path:
            check_architecture(plan.ckpt_path, plan.config, plan.shapes, self.model)
            if self.subcommand == "fit":  # a resume that would change the epoch, or count an epoch's end twice
                self.datamodule.check_resume(plan.data_state, plan.ckpt_path, self.trainer.world_size)
                if plan.epoch_end and self.trainer.max_steps != -1:
                    raise GptLitError(f"--ckpt_path {plan.ckpt_path} was saved at an epoch's end, from which "
                                      "Lightning's restore under a max_steps runs that epoch's end twice: resume with "
                                      "--trainer.max_epochs, without --trainer.max_steps")  # fmt: skip
        self.config_init[self.subcommand].weights_only = plan.weights_only  # passed to Trainer.<subcommand>

    def before_run(self) -> None:
        """Before the Trainer writes: the checkpoint and inputs checked, the folders writable, the CSV logs kept."""
        self.check_checkpoint()
        self.datamodule.check_inputs(self.subcommand, self.trainer.world_size)  # one prompt or batch a process
        folders = [logger.save_dir for logger in self.trainer.loggers if logger.save_dir]
        for folder in folders or [self.trainer.default_root_dir]:
            try:
                os.makedirs(folder, exist_ok=True)
                tempfile.TemporaryFile(dir=folder).close()
            except OSError as e:
                raise GptLitError(
                    f"cannot write to the log directory {folder} ({e.strerror or e}); choose another with "
                    f"--trainer.logger.init_args.save_dir (or --trainer.default_root_dir without a logger)"
                ) from None
        if self.last_checkpoint is not None:
            self.last_checkpoint.read_csv_logs(self.trainer)

    before_fit = before_validate = before_test = before_predict = before_run
    before_export = check_checkpoint  # nothing is logged: export writes only to --out

    def stopped(self, error: SystemExit) -> NoReturn:
        """Ctrl-C or SIGTERM stopped the subcommand: one ``error:`` line saying how to resume, and 130 or 143."""
        trainer = getattr(self, "trainer", None)  # None before the trainer is made
        if trainer is None or trainer.state.status != TrainerStatus.INTERRUPTED:
            raise error
        last = self.last_checkpoint
        by = (last and last.stop) or ("SIGTERM" if isinstance(error, SIGTERMException) else "Ctrl-C")
        how = "; no checkpoint was saved yet: start it again"
        if last is not None and last.saved_path:  # from what LastCheckpoint read at setup (log_dir is a broadcast)
            config = os.path.join(last.log_dir or "", "config.yaml")
            given = f"--config {config}" if os.path.isfile(config) else "<same arguments>"
            how = f"; resume with: {PROG} fit {given} --ckpt_path {last.saved_path}"
            if isinstance(trainer.logger, TensorBoardLogger) and len(trainer.loggers) == 1:  # (a list: continue_run)
                how += f" --trainer.logger.init_args.version {last.logger_version}"
        fail(f"{self.subcommand} stopped by {by}{how}", 143 if by == "SIGTERM" else 130)


def main(args: list[str] | None = None, extra_callbacks: Sequence[Callback] = ()) -> GPTLitCLI:
    """``python -m gpt_lit`` (``args``: in place of argv, ``extra_callbacks``: every run's); exits 2 on bad input."""
    try:
        return GPTLitCLI(
            GPTLightning, TimeMachineData, trainer_class=ExportingTrainer, args=args,
            save_config_kwargs={"overwrite": True}, trainer_defaults={"callbacks": [RNGState(), *extra_callbacks]},
            parser_kwargs={"description": "Train, evaluate, run and export the GPT of 'The transformer block'."},
        )  # fmt: skip
    except (GptLitError, MisconfigurationException) as e:
        fail(e)
    except KeyboardInterrupt:  # Ctrl-C outside fit/test/predict (while loading, parsing, ...)
        fail("interrupted", 130)
    except Exception as e:
        if isinstance(e, (ValueError, TypeError)) and raised_by_lightning(e):
            fail(e)
        traceback.print_exc()
        command = " ".join([PROG, *(sys.argv[1:] if args is None else args)])
        print(f"error: unexpected {type(e).__name__} (a bug, not your input) while running: {command}", file=sys.stderr)
        sys.exit(1)
