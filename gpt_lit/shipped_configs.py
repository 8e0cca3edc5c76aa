"""``-c``/``--config``: a config file's path, or a shipped config's name (``--config residual`` from any folder,
after any install)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jsonargparse import ActionConfigFile

from gpt_lit.errors import GptLitError

# The model's keys that come from the data (linked): (the data's key, the model's key).
LINKS = (("data.context_length", "model.config.context_length"), ("data.tokenizer", "model.config.vocab_size"))


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


class ConfigFile(ActionConfigFile):
    """``-c``/``--config``: jsonargparse's config file action, which also takes a shipped config's name
    (``find_config``; jsonargparse reads a path or YAML text), refuses a link's target set in the file (jsonargparse
    refuses it on the command line but drops it from a file silently), and tells the parser which file it reads, so
    that an error names it (jsonargparse's messages name the key, not the file)."""

    def __call__(self, parser: Any, cfg: Any, values: Any, option_string: str | None = None) -> None:
        path = find_config(values)
        parser.reading = path if Path(path).is_file() else None  # not YAML text, nor a file that is not there
        super().__call__(parser, cfg, path, option_string)
        for source, target in LINKS:
            if target in cfg:  # given, even as null
                parser.error(f'Linked "{target}" must be given via "{source}".')
        parser.reading = None
        parser.read.append(path)
