"""The training windows and the order an epoch takes them in, kept as a position a resumed run continues from.

Each epoch has one global order of the training windows, a permutation fixed by ``seed + epoch`` alone. A training
step takes the next ``processes * batch_size`` windows of it: process r gets the positions r, r + n, r + 2n, ... of
that slice (n processes). So "how far the epoch got" is a number of windows of the global order, whatever the batch
size or the number of processes, and a run resumed mid-epoch with other values of either continues from that window.
"""

from __future__ import annotations

import hashlib

import torch
from torch.utils.data import Dataset, DistributedSampler

from gpt_lit.errors import GptLitError


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


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The global order of ``n`` windows in ``epoch``: the permutation DistributedSampler draws for seed + epoch."""
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(n, generator=generator).tolist()


def steps_left(windows: int, done: int, per_step: int) -> int:
    """Full steps of ``per_step`` windows (processes x batch size) left after ``done`` of an epoch's ``windows``."""
    return max(windows - done, 0) // per_step


class GlobalOrderSampler(DistributedSampler):
    """This process's share of each epoch's global order, ``batch_size`` windows a step; it can start an epoch part-way.

    ``start=(epoch, w)``: in that epoch, begin at window ``w`` of the global order (the windows a checkpoint saved
    mid-epoch had already trained on are left out). Every epoch has ``windows // (processes * batch_size)`` steps
    (a last, partial step is dropped, as ``drop_last``): ``len()`` is that many batches, also in a started epoch,
    whose first ``len() - steps left`` batches Lightning counts as done (``TimeMachineData.train_dataloader``).
    A DistributedSampler, so that Lightning uses it as it is under several processes.
    """

    def __init__(
        self, dataset: Dataset, num_replicas: int, rank: int, seed: int, batch_size: int,
        start: tuple[int, int] | None = None,
    ):  # fmt: skip
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.batch_size, self.start = batch_size, start
        self.per_step = num_replicas * batch_size
        self.steps = len(dataset) // self.per_step

    def first_window(self) -> int:
        """The position in this epoch's global order where this epoch's training starts."""
        return self.start[1] if self.start is not None and self.start[0] == self.epoch else 0

    def __iter__(self):
        begin = self.first_window()
        end = begin + steps_left(len(self.dataset), begin, self.per_step) * self.per_step
        order = epoch_order(len(self.dataset), self.seed, self.epoch)
        return iter([order[p] for p in range(begin + self.rank, end, self.num_replicas)])

    def __len__(self) -> int:
        return self.steps * self.batch_size


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


ORDER_SETTINGS = ("seed", "context_length", "stride", "train_fraction")


def order_settings(data) -> dict:
    """What fixes the epochs' global orders (``data``: a TimeMachineData), as a checkpoint keeps it; the windows
    themselves once ``data`` is set up."""
    settings = {key: getattr(data, key) for key in ORDER_SETTINGS}
    if data.train_set is not None:
        settings.update(windows=len(data.train_set), windows_digest=data.train_set.fingerprint())
    return settings


def check_same_order(saved: dict, now: dict, source: str) -> None:
    """Raise a GptLitError if a checkpoint saved mid-epoch (``saved``: its state) had another order of windows
    than ``now`` (``order_settings``; the windows are compared when it has them)."""
    changed = [f"data.{key} {saved[key]} (now {now[key]})" for key in ORDER_SETTINGS if saved.get(key) != now[key]]
    if not changed and "windows_digest" in now and saved.get("windows_digest") != now["windows_digest"]:
        changed = ["another text (data.data_dir)"]
    if not changed:
        return
    raise GptLitError(
        f"{source} was saved mid-epoch (epoch {saved['epoch']}, after {saved['windows_done']} of its "
        f"{saved['windows']} training windows) with {', '.join(changed)}: the rest of that epoch's order of windows "
        f"is not this run's. Resume with the checkpoint's data settings until the epoch ends, then change them, or "
        f"resume from a checkpoint saved at the end of an epoch"
    )
