"""What a command will do with its checkpoint, resolved once before anything is built: the run plan.

``make_plan`` reads the parsed configuration of the subcommand and answers, in one place: which checkpoint
(``--ckpt_path last`` / ``best`` resolved to the newest run's file), whether it may be trusted and so how
Lightning's restore loads it (``weights_only``), what it holds that the checks before the restore need (read
once, as data unless trusted: gpt_lit/run/reading.py), the run folder it belongs to, and the command
line that started it all. The CLI makes the plan as it parses the command line and hands it on; the others
(the model, the run folders' rules in gpt_lit/run/folders.py, the checks before a restore) only read it. The walk of
``--ckpt_path`` goes one way: command line -> plan -> readers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jsonargparse import Namespace

from gpt_lit.errors import GptLitError
from gpt_lit.run.folders import LIGHTNING_CKPT_NAMES, checkpoints_dirpath, latest_checkpoint, run_of, runs_folder
from gpt_lit.run.reading import TRUST_OPTION, CheckpointContents, contents_of, read_checkpoint


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One command's plan; made once by ``make_plan``, read by everything after."""

    subcommand: str | None  # fit, validate, test, predict or export (None: no subcommand, e.g. --help)
    given: str | None  # --ckpt_path as given: a path, "last", "best", a URL, "hpc", "registry", or None
    ckpt_path: str | None  # what Lightning restores: the file "last"/"best" resolved to, else as given
    trusted: bool  # --trust_checkpoint true (given per command)
    weights_only: bool  # how Lightning's restore loads it: False only for a trusted file that needs it
    contents: CheckpointContents | None  # what the checkpoint holds, read once (None: Lightning alone reads it)
    run: Path | None  # the run folder the checkpoint is in (<run>/checkpoints/X.ckpt), if it is in one
    command_line: tuple[str, ...] = ()  # the arguments of the command, as given

    @property
    def weights_from_checkpoint(self) -> bool:
        """Whether a checkpoint gives every weight (so ``model.init_from``'s need not be fetched or loaded)."""
        return bool(self.ckpt_path)

    @property
    def resumes(self) -> bool:
        """Whether ``fit`` goes on from a checkpoint."""
        return self.subcommand == "fit" and bool(self.ckpt_path)


def make_plan(subcommand: str | None, config: Namespace | None, command_line: tuple[str, ...] = ()) -> RunPlan:
    """The plan of ``subcommand`` from its parsed configuration ``config`` (the CLI's ``config[subcommand]``).

    Lightning's ``--weights_only`` stays parseable (every run's config.yaml has ``weights_only: null``) but is not
    a second switch: ``false`` is a GptLitError. A missing, unreadable or refused checkpoint is a GptLitError now,
    before anything is built.
    """
    if not subcommand or config is None:
        return RunPlan(subcommand, None, None, False, True, None, None, command_line)
    trusted = bool(config.get("trust_checkpoint"))
    if config.get("weights_only") is False:
        raise GptLitError(f"--weights_only false: to load a checkpoint you trust as code, use {TRUST_OPTION}")
    given = path = config.get("ckpt_path")
    if path in ("last", "best"):  # in a new process: the newest run of this config's name
        path = latest_checkpoint(runs_folder(config.trainer), path, trusted, checkpoints_dirpath(config.trainer))
    contents, weights_only = None, True
    if path and path not in LIGHTNING_CKPT_NAMES and "://" not in path:  # a file: read it now, once
        ckpt, needed_trust = read_checkpoint(path, trusted)
        contents, weights_only = contents_of(ckpt), not needed_trust
    elif trusted:
        weights_only = False  # a file only Lightning reads (a URL, hpc, registry): loaded as the user trusts it
    return RunPlan(subcommand, given, path, trusted, weights_only, contents, run_of(path), command_line)
