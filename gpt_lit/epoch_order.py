"""The order each epoch takes the training windows in, kept as a position a resumed run continues from.

Each epoch has one global order of the training windows, a permutation fixed by ``seed + epoch`` alone. A training
step takes the next ``processes * batch_size`` windows of it: process r gets the positions r, r + n, r + 2n, ... of
that slice (n processes). So "how far the epoch got" is a number of windows of the global order, whatever the batch
size or the number of processes, and a run resumed mid-epoch with other values of either continues from that window.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, DistributedSampler

from gpt_lit.errors import GptLitError


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
