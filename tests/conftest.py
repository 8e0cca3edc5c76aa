import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Tests and CI read the book from the workplace's shared folder; the package itself never knows this path.
os.environ.setdefault("GPT_LIT_DATA_DIR", str(REPO.parent / "shared" / "data"))
BOOK = Path(os.environ["GPT_LIT_DATA_DIR"]) / "pg35.txt"

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
        pytest.fail(f"The Time Machine is not at {BOOK}: set GPT_LIT_DATA_DIR to the folder holding pg35.txt")
    return BOOK
