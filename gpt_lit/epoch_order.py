"""The order each epoch takes the training windows in (a permutation fixed by ``seed + epoch``, a step taking its next
``processes * batch_size``), and the training loader whose state Lightning saves and resumes mid-epoch from."""

import hashlib

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from gpt_lit.errors import GptLitError


class GlobalOrderSampler(DistributedSampler):
    """This process's share of each epoch's global order, ``batch_size`` windows a step; ``skip = (epoch, steps)``
    starts that epoch after a mid-epoch checkpoint's steps. A DistributedSampler, which Lightning uses as it is."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int, batch_size: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.batch_size, self.per_step = batch_size, num_replicas * batch_size
        self.steps = len(dataset) // self.per_step
        self.skip = (0, 0)

    def __iter__(self):
        begin = self.skip[1] * self.per_step if self.skip[0] == self.epoch else 0
        generator = torch.Generator().manual_seed(self.seed + self.epoch)  # DistributedSampler's permutation
        order = torch.randperm(len(self.dataset), generator=generator).tolist()  # the epoch's global order
        return iter([order[p] for p in range(begin + self.rank, self.steps * self.per_step, self.num_replicas)])

    def __len__(self) -> int:
        return self.steps * self.batch_size


class TrainLoader(DataLoader):
    """The training DataLoader with a state, which Lightning's fit loop saves in each checkpoint and loads on a resume:
    how many steps of the sampler's epoch had run (read from Lightning's batch ``progress``) and the ``settings``."""

    def __init__(self, *args, progress=None, settings: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.progress, self.settings = progress, settings or {}

    def state_dict(self) -> dict:
        if not isinstance(self.sampler, GlobalOrderSampler):  # trainer.overfit_batches puts Lightning's own in
            return {}
        # ``processed``: the batches whose step has run, wherever in a batch the checkpoint is saved.
        steps, done = (self.progress.current.processed, self.progress.is_last_batch) if self.progress else (0, False)
        return {"epoch": self.sampler.epoch, "steps": steps, "epoch_done": done, **self.settings}

    def load_state_dict(self, state: dict) -> None:
        check_same_batches(state, self.settings, "the checkpoint")
        if not state or not isinstance(self.sampler, GlobalOrderSampler):
            return
        epoch = state["epoch"] + state["epoch_done"]  # its iterator is made now: with workers, they draw at once
        self.sampler.set_epoch(epoch)
        self.sampler.skip = (epoch, 0 if state["epoch_done"] else state["steps"])


# What fixes an epoch's batches, and its name in a message.
SETTINGS = {"seed": "data.seed", "context_length": "data.context_length", "stride": "data.stride",
            "train_fraction": "data.train_fraction", "batch_size": "data.batch_size",
            "processes": "processes"}  # fmt: skip


def batch_settings(data, processes: int) -> dict:
    """What fixes an epoch's batches (``data``, a TimeMachineData, on ``processes`` processes), and its windows'."""
    settings = {key: getattr(data, key) for key in SETTINGS if key != "processes"}
    settings["processes"] = processes
    if data.train_set is not None:  # the windows: a digest of the text's tokens, the context length and the stride
        digest = hashlib.sha256(data.train_set.ids.numpy().tobytes() + f"{data.context_length},{data.stride}".encode())
        settings.update(windows=len(data.train_set), windows_digest=digest.hexdigest()[:16])
    return settings


def check_same_batches(saved: dict, now: dict, source: str) -> None:
    """A GptLitError if the loader's state ``saved`` is of an epoch under way whose batches ``now`` would change."""
    if not saved or saved["epoch_done"] or not saved["steps"]:
        return
    changed = [f"{name} {saved[key]} (now {now[key]})" for key, name in SETTINGS.items() if saved[key] != now[key]]
    if not changed and "windows_digest" in now and saved["windows_digest"] != now["windows_digest"]:
        changed = ["another text (data.data_dir)"]
    if not changed:
        return
    done = saved["steps"] * saved["batch_size"] * saved["processes"]
    raise GptLitError(
        f"{source} was saved mid-epoch (epoch {saved['epoch']}, after {done} of its {saved['windows']} training "
        f"windows) with {', '.join(changed)}: the rest of that epoch is not this run's batches. Resume with the "
        f"checkpoint's settings until the epoch ends, then change them, or resume from a checkpoint saved at the end "
        f"of an epoch"
    )
