"""The training and validation windows: ``context_length`` tokens every ``stride`` tokens of a text, each with its
target, the same tokens one further."""

from __future__ import annotations

import hashlib

import torch
from torch.utils.data import Dataset


class TokenWindows(Dataset):
    """Windows of ``context_length`` tokens every ``stride`` tokens; the target is the input shifted by one."""

    def __init__(self, ids: torch.Tensor, context_length: int, stride: int):
        self.ids, self.context_length, self.stride = ids, context_length, stride
        self.starts = list(range(0, len(ids) - context_length, stride))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.starts[i]
        return self.ids[s : s + self.context_length], self.ids[s + 1 : s + self.context_length + 1]

    def tokens_seen(self) -> int:
        """How many of the text's tokens are the input of some window."""
        if not self.starts:
            return 0
        return min(self.stride, self.context_length) * (len(self.starts) - 1) + self.context_length

    def fingerprint(self) -> str:
        """A short digest of the windows (the text's tokens, context length and stride): equal windows, equal digest."""
        digest = hashlib.sha256(self.ids.numpy().tobytes())
        digest.update(f"{self.context_length},{self.stride}".encode())
        return digest.hexdigest()[:16]


def skipped_text(train: TokenWindows, val: TokenWindows) -> str:
    """One sentence: how much of the training and validation text no window's input holds (a stride > context)."""
    parts = []
    for name, windows in (("training", train), ("validation", val)):
        total = len(windows.ids)
        skipped = total - windows.tokens_seen()
        parts.append(f"{skipped:,} of the {total:,} {name} tokens ({skipped / total:.0%})")
    return (
        f"data.stride={train.stride} is longer than data.context_length={train.context_length}: the windows skip "
        f"{parts[0]} and {parts[1]}; leave data.stride unset (null) for windows that cover the text"
    )
