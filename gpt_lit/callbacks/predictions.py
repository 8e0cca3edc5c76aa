"""Write what ``predict`` generated to a file in the run's log directory, and print it."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter


class ContinuationWriter(BasePredictionWriter):
    def __init__(self, filename: str = "continuations.txt"):
        """Collect every prompt's continuation; print them and save them as ``<log_dir>/<filename>``.

        Args:
            filename: Name of the file written in the run's log directory.
        """
        super().__init__(write_interval="epoch")
        self.filename = filename
        self.path: Path | None = None

    def write_on_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, predictions, batch_indices) -> None:
        texts = [text for batch in predictions for text in batch]
        self.path = Path(trainer.log_dir or trainer.default_root_dir) / self.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(f"{t}\n\n" for t in texts), encoding="utf-8")
        for t in texts:
            print(f"{t}\n")
        print(f"[{len(texts)} continuation(s) written to {self.path}]")
