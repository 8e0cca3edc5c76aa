"""Reading a checkpoint before Lightning restores it: there, readable, of the configured architecture, and loaded
with ``weights_only`` (unpickling runs any code a file carries) unless the reader trusts it (``--trust_checkpoint``)."""

import dataclasses
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from gpt_lit.errors import GptLitError, cli_key, one_line, say
from gpt_lit.model import GPTConfig

# GPTConfig: in the checkpoint of a GPTLightning made in Python. Process-wide, so Lightning's restore accepts it too.
torch.serialization.add_safe_globals([GPTConfig])

TRUST_OPTION = "--trust_checkpoint true"
TRUST_HELP = ("Load a checkpoint that holds more than tensors and plain data as the pickle it is: only for a file you "
              "trust, as unpickling it runs whatever code it carries. Given per command; not recorded in the run's "
              "config.yaml.")  # fmt: skip


def config_fields(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config) if isinstance(config, dict) else {}


def refusal(path: str, error: BaseException) -> str:
    """The ``error:`` line for a checkpoint that ``weights_only`` refused, naming what it would have created."""
    message = str(error)
    found = re.search(r"GLOBAL (\S+) (?:was not an allowed global|whose module)|got <class '([^']+)'>", message)
    told = one_line(message.split("WeightsUnpickler error:")[-1]) or type(error).__name__  # torch's own words
    needs = found and (found[1] or found[2]) or told
    return (f"checkpoint {path} was not loaded: it needs {needs}, which is not plain data (tensors, numbers, strings, "
            f"containers), and unpickling it would run code from the file; if you trust the file and where it came "
            f"from, add {TRUST_OPTION}")  # fmt: skip


def read_checkpoint(path: str, trust: bool = False) -> tuple[dict[str, Any], bool]:
    """The checkpoint at ``path`` (memory-mapped) and whether it needed ``trust``; a GptLitError if it can't be read."""
    if not Path(path).exists():
        raise GptLitError(f"checkpoint {path} does not exist")
    unreadable = f"{path} is not a readable checkpoint: truncated, or not a PyTorch file"
    if not zipfile.is_zipfile(path):  # text, empty, cut short: torch.load's message would be about mmap
        raise GptLitError(f"{unreadable} (not a complete zip archive, as every checkpoint is)")
    try:
        try:
            ckpt, trusted = torch.load(path, map_location="cpu", mmap=True, weights_only=True), False
        except pickle.UnpicklingError as e:
            if not trust:
                raise GptLitError(refusal(path, e)) from None
            ckpt, trusted = torch.load(path, map_location="cpu", mmap=True, weights_only=False), True
            say("warning", f"checkpoint {path} was loaded as code ({TRUST_OPTION}): any code it carries has run")
    except GptLitError:
        raise
    except Exception as e:  # a zip archive of something else
        raise GptLitError(f"{unreadable} ({one_line(e).split('. ')[0] or type(e).__name__})") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise GptLitError(f"{path} is a PyTorch file but not a Lightning checkpoint (it has no state_dict)")
    return ckpt, trusted


def check_architecture(path: str, theirs: dict[str, Any], saved: dict[str, tuple], model: LightningModule) -> None:
    """Raise a GptLitError naming the GPTConfig fields (but dropout) and tensor shapes that differ from the file's."""
    ours, wanted = config_fields(model.hparams.get("config")), model.state_dict()
    details = [f"{cli_key(k)} is {theirs[k]!r} in the checkpoint but {ours[k]!r} here"
               for k in ours if k in theirs and k != "dropout" and theirs[k] != ours[k]]  # fmt: skip
    shapes = [f"{k} {list(saved[k])} vs {list(v.shape)}" for k, v in wanted.items() if saved.get(k, v.shape) != v.shape]
    missing, unexpected = [k for k in wanted if k not in saved], [k for k in saved if k not in wanted]
    if shapes:
        details.append("shapes differ: " + ", ".join(shapes[:3]) + (", ..." if len(shapes) > 3 else ""))
    if missing:
        details.append(f"{len(missing)} tensors missing from the checkpoint (e.g. {missing[0]})")
    if unexpected:
        details.append(f"{len(unexpected)} tensors the model does not have (e.g. {unexpected[0]})")
    run_config = Path(path).parent.parent / "config.yaml"  # <run>/checkpoints/last.ckpt -> <run>/config.yaml
    hint = f"; use the run's own config: --config {run_config}" if run_config.is_file() else ""
    if details:
        raise GptLitError(f"checkpoint {path} is of a different architecture than the config: {'; '.join(details)}"
                          f"{hint}")  # fmt: skip
