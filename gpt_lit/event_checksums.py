"""TensorBoard's event files checksummed in C: the records' CRC32C from google-crc32c, not TensorBoard's Python loop.

Every record TensorBoard's writer appends carries a masked CRC32C of its bytes. Without TensorFlow it computes
it in pure Python (``tensorboard.compat.tensorflow_stub.pywrap_tensorflow.crc32c``), in the writer's thread,
holding the GIL that the epoch-end diagnostics drawing the next figure need; google-crc32c computes it in C
(docs/performance.md: the two compared). The bytes written are the same (tests check).
"""

from __future__ import annotations

import google_crc32c
from tensorboard.summary.writer import record_writer


def masked_crc32c(data: bytes) -> int:
    """The checksum TensorBoard's record format stores: CRC32C of ``data``, rotated right by 15 bits, plus a
    constant (TensorFlow's "masking"), as ``tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c``."""
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def use_c_checksums() -> None:
    """Make TensorBoard's writers, in this process, checksum their records with ``masked_crc32c``, where
    google-crc32c has its C implementation for this machine (its fallback is pure Python too)."""
    if google_crc32c.implementation == "c":
        # No public way: RecordWriter.write takes masked_crc32c from its module, no option.
        record_writer.masked_crc32c = masked_crc32c
