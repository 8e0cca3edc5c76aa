"""Where a bad configuration key or value came from: a YAML file and its line, or a command-line option."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml


def _yaml_keys(path: str) -> dict[str, tuple[int, str | None]]:
    """Every key of a YAML file, dotted (``model.config.emb_dim``): its line and, for a plain value, the value."""
    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    keys: dict[str, tuple[int, str | None]] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = f"{prefix}{key.value}"
                keys[name] = (key.start_mark.line + 1, value.value if isinstance(value, yaml.ScalarNode) else None)
                walk(value, f"{name}.")

    walk(root, "")
    return keys


CONFIG_OPTIONS = ("--config", "-c")


def _config_files(args: Sequence[str]) -> list[str]:
    return [b for a, b in zip(args, args[1:], strict=False) if a in CONFIG_OPTIONS]


def where_from(message: str, args: Sequence[str]) -> str:
    """Where the bad part of ``message`` came from: a YAML file (and line) or a command-line option; "" if unknown."""
    args = [part for arg in args for part in (arg.split("=", 1) if arg.startswith(("--config=", "-c=")) else [arg])]
    for path in _config_files(args):  # a file that is not YAML at all, or holds nothing
        try:
            if yaml.safe_load(Path(path).read_text(encoding="utf-8")) is None:
                return (
                    f"{path} is not a config: the file is empty (a config holds options as YAML keys; see "
                    "the shipped configs, or `python -m gpt_lit fit --print_config`)"
                )
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = f", line {mark.line + 1}" if mark else ""
            return f"{path}{line} is not valid YAML: {e.problem or e.context}"
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
    match = re.search(r"option '([\w.]+)'|Parser key \"([\w.]+)\"|^([\w.]+): expected|^Linked \"([\w.]+)\"", message)
    key = match and next(k for k in match.groups() if k)
    if not key:
        return ""
    value = re.search(r"(?:Given|Got) value: (.*?)\s*$", message)  # a bad value: the source that gave it
    wanted = value[1] if value else None
    for i, arg in enumerate(args):  # parsing stops at the first source with the bad key or value
        if arg in CONFIG_OPTIONS and i + 1 < len(args) and key in (keys := _yaml_keys(args[i + 1])):
            line, given = keys[key]
            if wanted is None or given == wanted:
                return f"in {args[i + 1]}, line {line}"
        elif arg == f"--{key}" or arg.startswith(f"--{key}="):
            given = arg.split("=", 1)[1] if "=" in arg else args[i + 1] if i + 1 < len(args) else None
            if wanted is None or given == wanted:
                return f"from the command line: --{key}"
    return ""
