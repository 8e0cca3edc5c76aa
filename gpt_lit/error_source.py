"""Where a bad configuration key or value came from, for the parser's one error line: jsonargparse's messages name
the key, not the config file it was read from (nor its line)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from gpt_lit.errors import short_type_error


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
