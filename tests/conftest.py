import logging
import os
from pathlib import Path

import pytest

from gpt_lit.data import DATA_DIR_ENV, SHIPPED_BOOK_DIR

# Importing Lightning before pytest's log capture starts makes its loggers print instead of propagating;
# let them propagate, so tests can read what a run says (caplog) wherever Lightning was first imported.
for name in ("lightning.pytorch", "lightning.fabric"):
    logging.getLogger(name).propagate = True

REPO = Path(__file__).resolve().parents[1]
# The tests read the book that ships with gpt_lit, as a reader's first run does: no other copy, no network.
os.environ.pop(DATA_DIR_ENV, None)
BOOK = SHIPPED_BOOK_DIR / "pg35.txt"

# A model small enough to train for a few steps in seconds, same code paths as the chapter's configs.
TINY = [
    "--model.config.emb_dim", "32",
    "--model.config.n_layers", "2",
    "--model.config.n_heads", "2",
    "--data.context_length", "32",
    "--data.batch_size", "4",
    "--data.eval_batch_size", "64",
]  # fmt: skip


# Trainer arguments for the tests' in-process runs: CPU, nothing written but the logger's events, quiet.
QUIET_TRAINER = {
    "accelerator": "cpu",
    "num_sanity_val_steps": 0,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


@pytest.fixture(scope="session")
def book_path() -> Path:
    if not BOOK.is_file():
        pytest.fail(f"The Time Machine is not at {BOOK}: the package's shipped book is missing")
    return BOOK
