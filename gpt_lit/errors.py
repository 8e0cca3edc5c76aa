"""Mistakes a user can fix: the one exception type for them, and how they are printed (one ``error:`` line)."""

import os
import re
import sys
import traceback
from typing import NoReturn

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.accelerators import AcceleratorRegistry


class GptLitError(Exception):
    """A problem with the user's input (data file, config, checkpoint, prompt), with what to do about it."""


def one_line(message: object) -> str:
    return " ".join(str(message).split())


@rank_zero_only
def say(kind: str, message: object) -> None:
    """Print ``<kind>: <message>`` (error, warning, note) as one line on stderr, once: from process 0 only."""
    print(f"{kind}: {one_line(message)}", file=sys.stderr)


def cli_key(field: str) -> str:
    """Where a ``GPTConfig`` field is set on the command line (two come from the data), for the error lines."""
    linked = {"context_length": "data.context_length", "vocab_size": "vocab_size (from data.tokenizer)"}
    return linked.get(field, f"model.config.{field}")


def fail(message: object, status: int = 2) -> NoReturn:
    """Say ``error: <message>`` and exit with ``status``: 2, a mistake in the input; 130 or 143, a stop."""
    say("error", message)
    sys.exit(status)


def short_type_error(message: str) -> str:
    """jsonargparse's "Parser key "k": ... <class 'int'> ... Given value: x" as "k: expected int, got 'x'"; a
    class_path that does not import as "k: cannot use class_path 'c': why"."""
    key = re.match(r'Parser key "([^"]+)":', message)
    bad_class = re.search(r"Problem with given class_path '([^']+)': (.*?) - ", message)
    if key and bad_class:
        return f"{key[1]}: cannot use class_path {bad_class[1]!r}: {bad_class[2]}"
    value = re.search(r"(?:Given|Got) value: (.*?)\s*$", message, re.S)
    expected = message.split("Given value type")[0]  # not the type of what was given
    types = list(dict.fromkeys(re.findall(r"<class '(\w+)'>", expected)))
    if not (key and value and types) or not set(types) <= {"int", "float", "str", "bool", "NoneType"}:
        return message
    names = " or ".join("null" if t == "NoneType" else t for t in types)
    return f"{key[1]}: expected {names}, got {value[1]!r}"


def raised_by_lightning(e: BaseException) -> bool:
    """Whether Lightning's own code raised ``e``, refusing a setting while running: the input's mistake, not a bug."""
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and f"{os.sep}lightning{os.sep}" in frames[-1].filename


def check_accelerator(name: object) -> None:
    """Refuse a ``trainer.accelerator`` this machine lacks, naming those it has (Lightning's for ``gpu`` names none)."""
    names = AcceleratorRegistry.available_accelerators()
    if not isinstance(name, str) or name not in {"gpu", *names}:
        return  # auto, an Accelerator object, or a name Lightning refuses itself with the names it knows
    has = sorted(n for n in names if AcceleratorRegistry[n]["accelerator"].is_available())
    if name not in has and not (name == "gpu" and {"cuda", "mps"} & set(has)):  # Lightning's gpu: CUDA or MPS
        raise GptLitError(f"--trainer.accelerator {name}: Lightning finds no {name.upper()} device on this machine, "
                          f"which has: {', '.join(has)}; use --trainer.accelerator {' or '.join(has)}, or auto for the "
                          f"best of them")  # fmt: skip
