"""Where each ``GPTConfig`` field is set on the command line, for the error lines that tell a user what to change.

Two fields come from the data module (the CLI links them): ``context_length`` from ``data.context_length`` and
``vocab_size`` from the data's tokenizer; every other field is ``model.config.<field>``. Checking a checkpoint's
architecture (reading.py) and GPT-2's released weights (pretrained.py) both name fields through here.
"""

from __future__ import annotations

LINKED = {"context_length": "data.context_length", "vocab_size": "vocab_size (from data.tokenizer)"}


def cli_key(field: str) -> str:
    """The command-line key of the ``GPTConfig`` field ``field`` (or, for vocab_size, where it comes from)."""
    return LINKED.get(field, f"model.config.{field}")
