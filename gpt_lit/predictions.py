"""Write what ``predict`` generated to a file beside the run it continues from, and print it."""

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from gpt_lit.distributed import gather_objects


class ContinuationWriter(BasePredictionWriter):
    def __init__(self, filename: str = "continuations.txt"):
        """Collect every prompt's continuation (process 0 gathers every process's, in the prompts' order); print them
        and save them as ``<log_dir>/<filename>``, predict's folder.

        Args:
            filename: Name of the file written in predict's folder.
        """
        super().__init__(write_interval="epoch")
        self.filename = filename
        self.path: Path | None = None

    def write_on_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, predictions, batch_indices) -> None:
        mine = [p for batch in predictions for p in batch]  # GPTLightning.predict_step's dicts
        everyone = sorted((p for share in gather_objects(trainer, mine) for p in share), key=lambda p: p["index"])
        texts = [p["text"] for p in everyone]
        self.path = Path(trainer.log_dir or trainer.default_root_dir) / self.filename
        if not trainer.is_global_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(f"{t}\n\n" for t in texts), encoding="utf-8")
        for t in texts:
            print(f"{t}\n")
        print(f"[{len(texts)} continuation(s) written to {self.path}]")
