"""The run plan: what a command does with its checkpoint, decided once as the command line is parsed (``last`` /
``best`` resolved, the file read once as data unless trusted, its run folder); every hook after it only reads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jsonargparse import Namespace

from gpt_lit.errors import GptLitError
from gpt_lit.run.folders import LIGHTNING_CKPT_NAMES, checkpoints_dirpath, latest_checkpoint, run_of, runs_folder
from gpt_lit.run.reading import TRUST_OPTION, CheckpointContents, contents_of, read_checkpoint


@dataclasses.dataclass(frozen=True)
class RunPlan:
    subcommand: str | None  # fit, validate, test, predict, export (None: e.g. --help)
    given: str | None  # --ckpt_path as given
    ckpt_path: str | None  # what Lightning restores: "last"/"best" resolved to a file
    trusted: bool  # --trust_checkpoint true
    weights_only: bool  # how Lightning's restore loads it
    contents: CheckpointContents | None  # what the file holds (None: only Lightning reads it, e.g. a URL)
    run: Path | None  # the run folder of <run>/checkpoints/X.ckpt
    command_line: tuple[str, ...] = ()

    @property
    def weights_from_checkpoint(self) -> bool:
        return bool(self.ckpt_path)

    @property
    def resumes(self) -> bool:
        return self.subcommand == "fit" and bool(self.ckpt_path)


def make_plan(subcommand: str | None, config: Namespace | None, command_line: tuple[str, ...] = ()) -> RunPlan:
    """The plan of ``subcommand`` from its parsed configuration; a missing or refused checkpoint fails here."""
    if not subcommand or config is None:
        return RunPlan(subcommand, None, None, False, True, None, None, command_line)
    trusted = bool(config.get("trust_checkpoint"))
    if config.get("weights_only") is False:  # Lightning's option stays parseable (config.yaml has it), not a switch
        raise GptLitError(f"--weights_only false: to load a checkpoint you trust as code, use {TRUST_OPTION}")
    given = path = config.get("ckpt_path")
    if path in ("last", "best"):
        path = latest_checkpoint(runs_folder(config.trainer), path, trusted, checkpoints_dirpath(config.trainer))
    contents, weights_only = None, not trusted  # a file only Lightning reads: loaded as the user trusts it
    if path and path not in LIGHTNING_CKPT_NAMES and "://" not in path:
        ckpt, needed_trust = read_checkpoint(path, trusted)
        contents, weights_only = contents_of(ckpt), not needed_trust
    return RunPlan(subcommand, given, path, trusted, weights_only, contents, run_of(path), command_line)
