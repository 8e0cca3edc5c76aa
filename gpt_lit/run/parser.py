"""The command line and config files: ``--config`` (a path, or a shipped config's name), a run's own config.yaml, and
an ``error:`` line naming the file and line, or the option, a bad key came from (jsonargparse's name only the key)."""

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


def shipped_configs() -> dict[str, Path]:
    """The shipped configs by name: ``gpt_lit/configs`` in an installed wheel, ``configs/`` in a checkout."""
    package = Path(__file__).resolve().parent.parent
    folder = package / "configs" if (package / "configs").is_dir() else package.parent / "configs"
    return {path.stem: path for path in sorted(folder.glob("*.yaml"))}


class ConfigFile(ActionConfigFile):
    """jsonargparse's config file action that also takes a shipped config's name (a path that exists wins; inline YAML
    is the parser's), refuses a link's target set in the file (jsonargparse drops it silently), and tells the parser
    which file it reads, for the error line."""

    def __call__(self, parser: Any, cfg: Any, values: Any, option_string: str | None = None) -> None:
        path, configs = values, shipped_configs()
        if not Path(values).exists() and re.fullmatch(r"(configs/)?[\w.-]+", values):  # residual, configs/residual.yaml
            name = Path(values).name.removesuffix(".yaml").removesuffix(".yml")
            if name not in configs:
                raise GptLitError(f"--config {values}: no such file, and no shipped config of that name; the shipped "
                                  f"configs are {', '.join(configs)} (give one of these names, or a config file's "
                                  f"path)")  # fmt: skip
            path = str(configs[name])
        parser.reading = path if Path(path).is_file() else None  # not YAML text, nor a file that is not there
        super().__call__(parser, cfg, path, option_string)
        for source, target in LINKS:
            if target in cfg:  # given, even as null
                parser.error(f'Linked "{target}" must be given via "{source}".')
        parser.reading = None
        parser.read.append(path)


def key_line(path: str, key: str) -> str:
    """", line N" where the YAML file ``path`` sets the dotted ``key`` (or a key ending with it); "" if none."""
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


def error_line(message: str, error: Exception | None, reading: str | None, read: Sequence[str]) -> str:
    """The ``error:`` line for jsonargparse's ``message`` and where its key came from: the file being read, else the
    last file of ``read`` that sets an unknown key, else the command line."""
    cause = error.__cause__ if error is not None else None
    if reading and isinstance(cause, yaml.MarkedYAMLError):  # jsonargparse's "Problems parsing config: ..."
        mark = cause.problem_mark or cause.context_mark
        return f"{reading}{f', line {mark.line + 1}' if mark else ''} is not valid YAML: {cause.problem}"
    if reading and message == "Unexpected config:":  # jsonargparse's message for a file of no YAML at all
        return (f"{reading} is not a config: the file is empty (a config holds options as YAML keys; see the shipped "
                "configs, or `python -m gpt_lit fit --print_config`)")  # fmt: skip
    named = re.search(r'(?:Parser key|Linked) "([\w.]+)"|option \'([\w.]+)\'', message)
    key = named and (named[1] or named[2])
    if reading:
        source = f"in {reading}{key_line(reading, key) if key else ''}"
    elif key and isinstance(error, KeyError):  # the command line's unknown keys are "unrecognized arguments"
        source = next((f"in {path}{line}" for path in reversed(read) if (line := key_line(path, key))), "")
    else:
        source = f"from the command line: --{key}" if key else ""
    return f"{short_type_error(message)} ({source + '; ' if source else ''}--help lists the options)"


class GPTLitParser(LightningArgumentParser):
    """jsonargparse's parser with one ``error:`` line in place of the usage; without ``--config``, a subcommand on a
    run's checkpoint takes the run's config.yaml as defaults (``folders.run_config``)."""

    def __init__(self, *args: Any, read: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read = [] if read is None else read  # the config files read so far, shared with the subcommands' parsers
        self.reading: str | None = None  # the config file being read

    def parse_args(self, args: Any = None, namespace: Any = None, **kwargs: Any) -> Namespace:
        config = super().parse_args(args, namespace, **kwargs)
        found = run_config(getattr(self, "subcommand", None), config)  # jsonargparse names a subcommand's parser
        if found is None:
            return config
        self.default_config_files = [glob.escape(found[0])]  # under the command line, as a --config given first
        self.reading = found[0]  # the command line alone parsed above: what fails now is the file's
        config = super().parse_args(args, namespace, **kwargs)
        self.reading = None
        config.ckpt_path = found[1]  # "last"/"best" as found in the run
        return config

    def dump(self, namespace: Namespace, *args: Any, **kwargs: Any) -> str:
        """jsonargparse's, without validating again what ``parse_args`` did (LightningCLI dumps each config twice)."""
        return super().dump(namespace, *args, **{**kwargs, "skip_validation": True})

    def add_method_arguments(self, *args: Any, **kwargs: Any) -> list[str]:
        """A subcommand's arguments; ``--ckpt_path`` tells the model a checkpoint gives every weight (linked)."""
        added = super().add_method_arguments(*args, **kwargs)
        if "ckpt_path" in added and "model.weights_from_checkpoint" in self.get_defaults():
            self.link_arguments("ckpt_path", "model.weights_from_checkpoint", compute_fn=bool)
        return added

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse is trying alternatives internally: let it
            super().error(message, ex)
        fail(error_line(one_line(message), ex, self.reading, self.read))
