"""CPU memory reuse: keep the memory a training step frees in the process, for the next step to use again."""

from __future__ import annotations

import ctypes
import sys


def keep_freed_memory() -> bool:
    """Keep freed memory in the process (glibc's malloc) instead of giving it back to the OS at once.

    By default glibc serves every allocation above 32 MB with a fresh ``mmap`` and unmaps it when freed, so
    each training step page-faults and zero-fills its logits again, and much of a run's CPU time goes
    to the kernel. Serving them from the heap and never trimming it keeps those pages mapped (the process's
    memory stays at its peak). Returns False where it does not apply.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False
