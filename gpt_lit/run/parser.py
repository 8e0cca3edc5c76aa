"""Reading the command line and config files: ``-c``/``--config`` (a file's path, or a shipped config's name:
``--config residual`` from any folder, after any install), a run's own config.yaml under validate/test/predict/export,
and the parser's one ``error:`` line, naming the config file and line, or the command-line option, a bad key or value
came from (jsonargparse's messages name the key, not the file it was read from)."""

from __future__ import annotations

import glob
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from jsonargparse import ActionConfigFile, Namespace
from lightning.pytorch.cli import LightningArgumentParser

from gpt_lit.errors import GptLitError, fail, one_line, short_type_error
from gpt_lit.run.folders import run_config

# The model's keys that come from the data (linked): (the data's key, the model's key).
LINKS = (("data.context_length", "model.config.context_length"), ("data.tokenizer", "model.config.vocab_size"))


def configs_dir() -> Path:
    """The shipped configs: ``gpt_lit/configs`` in an installed wheel, ``configs/`` at the top of a checkout."""
    package = Path(__file__).resolve().parent.parent
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


def key_line(path: str, key: str) -> str:
    """The line where the YAML file ``path`` sets the dotted ``key`` (or a key ending with it), as ", line N";
    "" where it does not."""
    try:
        nodes = [(yaml.compose(Path(path).read_text(encoding="utf-8")), "")]
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ""
    while nodes:
        node, prefix = nodes.pop()
        for name, value in node.value if isinstance(node, yaml.MappingNode) else []:
            dotted = f"{prefix}{name.value}"
            if dotted == key or dotted.endswith(f".{key}"):
                return f", line {name.start_mark.line + 1}"
            nodes.append((value, f"{dotted}."))
    return ""


def where_from(message: str, error: Exception | None, reading: str | None, read: Sequence[str]) -> str:
    """Where the key of jsonargparse's ``message`` came from: ``reading``, the config file being read when it
    failed (a value is checked as its file is read); else, for an unknown key (a KeyError: the command line's are
    "unrecognized arguments"), the last file of ``read`` that sets it; else the command line. "" if no key is named."""
    named = re.search(r'(?:Parser key|Linked) "([\w.]+)"|option \'([\w.]+)\'', message)
    key = named and (named[1] or named[2])
    if reading:
        return f"in {reading}{key_line(reading, key) if key else ''}"
    if not key:
        return ""
    if isinstance(error, KeyError):
        return next((f"in {path}{line}" for path in reversed(read) if (line := key_line(path, key))), "")
    return f"from the command line: --{key}"


def error_line(message: str, error: Exception | None, reading: str | None, read: Sequence[str]) -> str:
    """The one line (after ``error:``) for jsonargparse's ``message`` and the exception ``error`` behind it:
    ``reading`` a config file that is not YAML, or holds no options, says so; anything else is jsonargparse's
    message (``short_type_error``), where it came from (``where_from``), and where the options are listed."""
    cause = error.__cause__ if error is not None else None
    if reading and isinstance(cause, yaml.MarkedYAMLError):  # jsonargparse's "Problems parsing config: ..."
        mark = cause.problem_mark or cause.context_mark
        return f"{reading}{f', line {mark.line + 1}' if mark else ''} is not valid YAML: {cause.problem}"
    if reading and message == "Unexpected config:":  # jsonargparse's message for a file of no YAML at all
        return (
            f"{reading} is not a config: the file is empty (a config holds options as YAML keys; see the shipped "
            "configs, or `python -m gpt_lit fit --print_config`)"
        )
    source = where_from(message, error, reading, read)
    return f"{short_type_error(message)} ({source + '; ' if source else ''}--help lists the options)"


class GPTLitParser(LightningArgumentParser):
    """jsonargparse's parser, but a bad argument or config key prints one ``error:`` line instead of the usage,
    naming the config file and line, or the command-line option, it came from (``error_line``); and the parser of
    validate/test/predict/export takes a run's checkpoint's own config.yaml as its defaults when no ``--config``
    is given (``folders.run_config``)."""

    def __init__(self, *args: Any, read: list[str] | None = None, **kwargs: Any) -> None:
        """``read``: the config files read so far (ConfigFile's), shared by the parser and its subcommands'."""
        super().__init__(*args, **kwargs)
        self.read = [] if read is None else read
        self.reading: str | None = None  # the config file being read

    def parse_args(self, args: Any = None, namespace: Any = None, **kwargs: Any) -> Namespace:
        config = super().parse_args(args, namespace, **kwargs)
        found = run_config(getattr(self, "subcommand", None), config)  # jsonargparse names a subcommand's parser
        if found is None:
            return config
        self.default_config_files = [glob.escape(found[0])]  # under the command line, as a --config given first
        config = super().parse_args(args, namespace, **kwargs)
        config.ckpt_path = found[1]  # "last"/"best" as found in the run
        return config

    def add_method_arguments(self, *args: Any, **kwargs: Any) -> list[str]:
        """A subcommand's arguments (Trainer.fit's, ...); with ``--ckpt_path`` among them, the model learns from it
        that a checkpoint gives every weight (GPTLightning's ``weights_from_checkpoint``, linked)."""
        added = super().add_method_arguments(*args, **kwargs)
        if "ckpt_path" in added and "model.weights_from_checkpoint" in self.get_defaults():
            self.link_arguments("ckpt_path", "model.weights_from_checkpoint", compute_fn=bool)
        return added

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse is trying alternatives internally: let it
            super().error(message, ex)
        fail(error_line(one_line(message), ex, self.reading, self.read))
