"""Reading a checkpoint before Lightning restores it: is it there, readable, and of the configured architecture?"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from gpt_lit.errors import GptLitError, one_line

# where each GPTConfig field is set on the command line (two come from the data module, linked)
CONFIG_KEYS = {"context_length": "data.context_length", "vocab_size": "vocab_size (from data.tokenizer)"}


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
