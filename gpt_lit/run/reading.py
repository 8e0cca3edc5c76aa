"""Reading a checkpoint before Lightning restores it: is it there, readable, data only, of the configured
architecture?

A checkpoint is a pickle, and unpickling can run any code the file carries. Every checkpoint is therefore
loaded with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists, dicts and the few types
allowlisted below, nothing else. A checkpoint written by gpt_lit holds nothing more (measured on the
shipped configs' runs, a ModelCheckpoint of the reader's, Ctrl-C/SIGTERM saves, bf16-mixed, two processes);
the one extra type, ``GPTConfig``, appears when a GPTLightning made in Python (not by the CLI, which saves
its config as a dict) saves a checkpoint. A file that needs anything else is refused before any of it runs,
unless the reader trusts it (``--trust_checkpoint true``).
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from gpt_lit.errors import GptLitError, one_line, say
from gpt_lit.model import GPTConfig
from gpt_lit.run.cli_keys import cli_key

# Types beyond torch's own allowlist that a gpt_lit checkpoint may hold: plain data, whose unpickling runs none
# of the file's code. Process-wide, so Lightning's own restore (Trainer.fit/validate/test/predict with
# weights_only=True) and every process of a multi-process run accept them too.
SAFE_GLOBALS: list[Any] = [GPTConfig]
torch.serialization.add_safe_globals(SAFE_GLOBALS)

TRUST_OPTION = "--trust_checkpoint true"
TRUST_HELP = (
    "Load a checkpoint that holds more than tensors and plain data (an older or foreign file) as the pickle it "
    "is. Only for a file you trust: unpickling it runs whatever code it carries, with your permissions. Without "
    "it such a file is refused before any of it runs. (Given per command; not recorded in the run's config.yaml.)"
)

def _config_fields(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config) if isinstance(config, dict) else {}


def refused_global(error: BaseException) -> str:
    """What ``torch.load(weights_only=True)`` refused to create, from its UnpicklingError's message."""
    message = str(error)
    for pattern in (
        r"GLOBAL (\S+) was not an allowed global",  # a function or class not on the allowlist
        r"unsupported GLOBAL (\S+) whose module",  # one from a blocked module (os, subprocess, ...)
        r"(?:but got|got) <class '([^']+)'>",  # an object it was asked to build or fill
    ):
        if m := re.search(pattern, message):
            return m[1]
    reason = message.split("WeightsUnpickler error:")[-1].strip().splitlines()
    return one_line(reason[0]) if reason else type(error).__name__


def refusal(path: str, error: BaseException) -> str:
    """The ``error:`` line for a checkpoint that ``weights_only`` loading refused."""
    return (
        f"checkpoint {path} was not loaded: it needs {refused_global(error)}, which is not plain data (tensors, "
        f"numbers, strings, containers), and unpickling it would run code from the file; if you trust the file "
        f"and where it came from, add {TRUST_OPTION}"
    )


def warn_loaded_as_code(path: str) -> None:
    say("warning", f"checkpoint {path} was loaded as code ({TRUST_OPTION}): any code it carries has run")


def load_checkpoint(path: str | Path, trust: bool = False, **kwargs: Any) -> tuple[Any, bool]:
    """``torch.load(path, **kwargs)`` as data only; the file's contents and whether it needed ``trust``.

    A file that holds anything but tensors, plain data and ``SAFE_GLOBALS`` raises a GptLitError naming the
    refused type, unless ``trust``: then it is unpickled in full (which runs the code it carries) and a
    ``warning:`` line says so. A file that loads as data is always loaded as data, trusted or not.
    """
    try:
        return torch.load(path, weights_only=True, **kwargs), False
    except pickle.UnpicklingError as e:
        if not trust:
            raise GptLitError(refusal(str(path), e)) from None
    ckpt = torch.load(path, weights_only=False, **kwargs)
    warn_loaded_as_code(str(path))
    return ckpt, True


def read_checkpoint(path: str, trust: bool = False) -> tuple[dict[str, Any], bool]:
    """The checkpoint at ``path`` (memory-mapped, so cheap) and whether it needed ``trust`` (``load_checkpoint``);
    a GptLitError when it is missing, unreadable or (without ``trust``) would run code."""
    file = Path(path)
    if not file.exists():
        raise GptLitError(f"checkpoint {path} does not exist")
    if not file.is_file():
        raise GptLitError(f"checkpoint {path} is a directory, not a .ckpt file")
    unreadable = f"{path} is not a readable checkpoint: truncated, or not a PyTorch file"
    try:
        with file.open("rb") as f:
            whole = zipfile.is_zipfile(f)
    except OSError as e:
        raise GptLitError(f"checkpoint {path} cannot be read ({e.strerror or e}); check its permissions") from None
    if not whole:  # text, empty, cut short: torch.load's message would be about mmap
        raise GptLitError(f"{unreadable} (not a complete zip archive, as every checkpoint is)")
    try:
        ckpt, trusted = load_checkpoint(file, trust, map_location="cpu", mmap=True)
    except GptLitError:
        raise
    except Exception as e:  # a zip archive of something else: unreadable here
        reason = one_line(e).split(". ")[0] or type(e).__name__
        raise GptLitError(f"{unreadable} ({reason})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise GptLitError(f"{path} is a PyTorch file but not a Lightning checkpoint (it has no state_dict)")
    return ckpt, trusted


@dataclasses.dataclass(frozen=True)
class CheckpointContents:
    """What the checks before a restore need of a checkpoint, kept without its tensors (which would keep the
    memory-mapped file open for the whole run): read once, by the run plan (gpt_lit/run/plan.py)."""

    config: dict[str, Any]  # the GPTConfig fields in its hyperparameters ({} when it has none)
    shapes: dict[str, tuple[int, ...]]  # each state_dict tensor's shape
    data_state: dict[str, Any]  # the training loader's state (epoch_order.TrainLoader), {} when it has none


def contents_of(ckpt: dict[str, Any]) -> CheckpointContents:
    """The ``CheckpointContents`` of a checkpoint read with ``read_checkpoint``."""
    fit_loop = (ckpt.get("loops") or {}).get("fit_loop") or {}
    loader_states = fit_loop.get("state_dict", {}).get("combined_loader") or [{}]  # Lightning's fit loop saves them
    return CheckpointContents(
        config=_config_fields((ckpt.get("hyper_parameters") or {}).get("config")),
        shapes={k: tuple(getattr(v, "shape", ())) for k, v in ckpt["state_dict"].items()},
        data_state=copy.deepcopy(loader_states[0]),  # a copy: no view into the file
    )


def check_architecture(path: str, contents: CheckpointContents, model: LightningModule) -> None:
    """Raise a GptLitError naming the differing GPTConfig fields and tensor shapes, if there are any."""
    # Which GPTConfig fields differ (dropout does not change the architecture), then which tensors.
    theirs = contents.config
    ours = _config_fields(model.hparams.get("config"))
    details = [
        f"{cli_key(k)} is {theirs[k]!r} in the checkpoint but {ours[k]!r} here"
        for k in ours
        if k in theirs and k != "dropout" and theirs[k] != ours[k]
    ]
    saved, wanted = contents.shapes, model.state_dict()
    shapes = [
        f"{k} {list(saved[k])} vs {list(v.shape)}"
        for k, v in wanted.items()
        if k in saved and saved[k] != tuple(v.shape)
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
