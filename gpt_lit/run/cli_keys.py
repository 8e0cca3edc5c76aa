"""Where each ``GPTConfig`` field is set on the command line, for error lines (checkpoints, released weights)."""

from __future__ import annotations

LINKED = {"context_length": "data.context_length", "vocab_size": "vocab_size (from data.tokenizer)"}  # from the data


def cli_key(field: str) -> str:
    return LINKED.get(field, f"model.config.{field}")
