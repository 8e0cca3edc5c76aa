"""Attention, per head: what each position of a fixed sentence looks at, and how spread out the heads' rows are."""

import lightning as L

from gpt_lit.diagnostics.figures import AttentionChart
from gpt_lit.diagnostics.probe import Probe, tensorboards
from gpt_lit.measure import attention_entropy, attention_weights
from gpt_lit.tokenizer import get_tokenizer


def token_labels(ids: list[int]) -> list[str]:
    """Each token as text for an axis label: a line break as ↵, at most 12 characters."""
    enc = get_tokenizer()
    return [enc.decode([i]).replace("\n", "↵")[:12] for i in ids]


class AttentionMaps(Probe):
    def __init__(self, num_tokens: int = 24, num_sequences: int = 4):
        """Images ``attention/block_N``: each head's weights on the first validation window's first tokens; scalars
        ``attention/entropy/block_N``: the rows' mean entropy in nats, lower is sharper (docs/inside_the_block.md).

        Args:
            num_tokens: How many tokens of the first validation window the images show.
            num_sequences: How many validation windows the entropy averages over.
        """
        super().__init__(num_sequences)
        self.num_tokens = num_tokens
        self.chart: AttentionChart | None = None  # drawn in full once, for the sentence's labels

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.chart = None  # each fit's own sentence
        super().on_train_start(trainer, pl_module)

    def probe(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, epoch: float) -> dict[str, float]:
        weights = attention_weights(pl_module.model, self.record(pl_module))
        writers, n = tensorboards(trainer), self.num_tokens
        if writers and self.chart is None:
            self.chart = AttentionChart(token_labels(self.inputs[0, :n].tolist()), n_heads=weights[0].shape[1])
        for i, w in enumerate(weights if writers else [], 1):
            pixels = self.chart.pixels(w[0, :, :n, :n].cpu(), i, epoch, step)  # the first window's sentence
            for writer in writers:
                writer.add_image(f"attention/block_{i}", pixels, step, dataformats="HWC")
        return {f"attention/entropy/block_{i}": attention_entropy(w).mean().item() for i, w in enumerate(weights, 1)}
