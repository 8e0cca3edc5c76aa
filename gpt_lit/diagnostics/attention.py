"""Attention, per head: what each position of a fixed sentence looks at, and how spread out the heads' rows are."""

from __future__ import annotations

import lightning as L

from gpt_lit.diagnostics.figures import AttentionChart
from gpt_lit.diagnostics.probe import Probe, tensorboards
from gpt_lit.measure import attention_entropy, attention_weights, record_blocks
from gpt_lit.tokenizer import get_tokenizer


def token_labels(ids: list[int]) -> list[str]:
    """Each token as text for an axis label: a line break as ↵, at most 12 characters."""
    enc = get_tokenizer()
    return [enc.decode([i]).replace("\n", "↵")[:12] for i in ids]


class AttentionMaps(Probe):
    def __init__(self, num_tokens: int = 24, num_sequences: int = 4):
        """Draw each block's attention weights for one fixed sentence, and log how sharp the heads are.

        Images ``attention/block_1`` ... ``block_N``: for the first ``num_tokens`` tokens of the first validation
        window, every head of the block side by side, a row per token (query), a column per token it may look
        at (keys up to it), the tokens as labels. Scalars ``attention/entropy/block_1`` ... ``block_N``: the mean
        entropy, in nats, of the attention rows over every head, position and the first ``num_sequences``
        validation windows (a fixed batch); lower is sharper (a row that looks at one token has 0, a row
        spread evenly over t tokens has log t). At the start of a fresh run and after every validation of
        ``fit``, at the step of its ``loss/val``, in eval mode without gradients; the scalars to every logger,
        the images to every TensorBoard logger. The weights are softmax(Q K^T / sqrt(head_dim) + mask)
        (``measure.attention_weights``). Skipped, with one logged line, under strategies that shard the parameters.

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
        weights = attention_weights(pl_module.model, record_blocks(pl_module.model, self.batch(pl_module)[0]))
        writers, n = tensorboards(trainer), self.num_tokens
        if writers and self.chart is None:
            self.chart = AttentionChart(token_labels(self.inputs[0, :n].tolist()), n_heads=weights[0].shape[1])
        for i, w in enumerate(weights if writers else [], 1):
            pixels = self.chart.pixels(w[0, :, :n, :n].cpu(), i, epoch, step)  # the first window's sentence
            for writer in writers:
                writer.add_image(f"attention/block_{i}", pixels, step, dataformats="HWC")
        return {f"attention/entropy/block_{i}": attention_entropy(w).mean().item() for i, w in enumerate(weights, 1)}
