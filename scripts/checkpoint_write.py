"""How long writing one checkpoint takes, as gpt_lit writes it (whole blocks past the page cache) and through the cache.

    python scripts/checkpoint_write.py                # a checkpoint of the chapter's model and AdamW (347 MB), 5 rounds
    python scripts/checkpoint_write.py --gap 0        # the writes back to back
    python scripts/checkpoint_write.py --dir /path/on/another/disk

It serializes what ``fit`` saves for residual.yaml's model (weights and AdamW's two moments, after one step) and
writes those bytes with ``gpt_lit.checkpointing.write_atomically`` (temporary file, write, fsync, rename) into a
temporary folder under ``--dir`` (default: here, where ``lightning_logs`` goes), alternating two ways each round:
``uncached``, as ``fit`` writes (``write_uncached``: O_DIRECT where the filesystem has it), and ``cached``, through
the page cache (what a plain write does). For each: the median wall seconds and kernel (system) CPU seconds of a
write, and the most kernel seconds one took. The kernel's seconds are taken from a core that training runs on.

A run saves once an epoch, tens of seconds apart, and ``--gap`` (10 s) waits that long before each write: on a VM
whose host takes back the guest's freed memory, the pages the previous file's deletion freed are gone by then, and
a write through the page cache takes fresh ones (docs/performance.md has the figures).
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from gpt_lit import checkpointing
from gpt_lit.model import GPT, GPTConfig


def chapter_checkpoint_bytes() -> memoryview:
    """``torch.save`` of residual.yaml's model and its AdamW state after one step, as in a checkpoint."""
    model = GPT(GPTConfig(vocab_size=50257, context_length=128, emb_dim=256, n_layers=4, n_heads=4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1)
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    buffer = io.BytesIO()
    torch.save({"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}, buffer)
    return buffer.getbuffer()


def timed_write(data: memoryview, path: Path, cached: bool) -> tuple[float, float]:
    """(wall s, kernel CPU s) of one ``write_atomically``; through the page cache where ``cached``."""
    uncached = (lambda fd, data: 0) if cached else checkpointing.write_uncached
    with mock.patch.object(checkpointing, "write_uncached", uncached):
        before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime, time.perf_counter()
        checkpointing.write_atomically(data, path)
        return time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_stime - before


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="writes of each kind (alternated)")
    parser.add_argument("--dir", default=".", help="where the temporary folder goes")
    parser.add_argument("--mb", type=float, help="write this many MB of random bytes instead of the checkpoint")
    parser.add_argument("--gap", type=float, default=10.0, help="seconds between writes (a run saves once an epoch)")
    args = parser.parse_args(argv)
    data = memoryview(torch.randn(int(args.mb * 2**18)).numpy().tobytes()) if args.mb else chapter_checkpoint_bytes()
    times: dict[str, list[tuple[float, float]]] = {"uncached": [], "cached": []}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".checkpoint_write.") as folder:
        for _ in range(args.rounds):
            for way in times:
                time.sleep(args.gap)
                times[way].append(timed_write(data, Path(folder) / "last.ckpt", cached=way == "cached"))
    out = {"bytes": float(len(data))}
    for way, samples in times.items():
        out[f"{way}_wall_s"] = statistics.median(wall for wall, _ in samples)
        out[f"{way}_kernel_s"] = statistics.median(kernel for _, kernel in samples)
        out[f"{way}_kernel_s_max"] = max(kernel for _, kernel in samples)
    for name, value in out.items():
        print(f"{name}: {int(value)}" if name == "bytes" else f"{name}: {value:.4g}")
    return out


if __name__ == "__main__":
    main()
