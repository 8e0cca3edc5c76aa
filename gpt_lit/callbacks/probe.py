"""How many of torch's threads the samples' small passes use."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class ThreadChoice:
    """How many of torch's threads the diagnostics' passes use: all of training's, if training's own threads had
    their cores, else one.

    The passes are small (a few windows, or one token at a time). With the CPU to itself, a run's threads make
    them faster than one; with another program busy on a core, the same threads wait for each other and make
    them slower than one (docs/performance.md). Whether the cores were free shows in the run
    itself: the CPU time this process got per second of wall time since the last choice (the epoch's training
    and evaluation), against its ``threads``. The first choice, with nothing measured yet, is one thread; a choice
    holds for ``interval`` seconds, so the diagnostics of one epoch's end share it.
    """

    def __init__(self, interval: float = 5.0, share: float = 0.75):
        self.interval = interval  # seconds of wall time a choice holds, and the least a measurement spans
        self.share = share  # the part of ``threads`` CPU-seconds per second that counts as the cores being free
        self.since: tuple[float, float] | None = None  # (wall, CPU) clocks when the last choice was made
        self.chosen = 1

    def __call__(self, threads: int) -> int:
        wall, cpu = time.perf_counter(), time.process_time()
        if self.since is None or wall - self.since[0] >= self.interval:
            if self.since is not None:
                got = (cpu - self.since[1]) / (wall - self.since[0])  # CPU-seconds per second: ~threads when free
                self.chosen = threads if got > self.share * threads else 1
            self.since = (wall, cpu)
        return min(self.chosen, threads)


_THREAD_CHOICE = ThreadChoice()  # one per process: every diagnostic of a run reads the same clocks


@contextmanager
def diagnostic_threads() -> Iterator[None]:
    """torch's threads for the diagnostics' passes as ``ThreadChoice`` says, training's number again after."""
    threads = torch.get_num_threads()
    inside = _THREAD_CHOICE(threads) if threads > 1 else threads
    if inside != threads:
        torch.set_num_threads(inside)
    try:
        yield
    finally:
        if inside != threads:
            torch.set_num_threads(threads)
