"""The chapter's diagnostics (docs/tensorboard.md), each a small Lightning Callback a config lists in
``trainer.callbacks`` as ``gpt_lit.diagnostics.X``: it measures with ``gpt_lit.measure``, logs scalars with
``pl_module.log`` from a validation hook and figures (``figures.py``) through the TensorBoard writer; ``probe.py``
holds what they share. They import torch, Lightning, matplotlib, TensorBoard and gpt_lit/*.py, never gpt_lit/run/."""

from gpt_lit.diagnostics.attention import AttentionMaps
from gpt_lit.diagnostics.blocks import BlockGradNorms, LogitLens, PositionSimilarity, ResidualStream
from gpt_lit.diagnostics.losses import ChapterFigures, RunsTable, UnigramBaseline
from gpt_lit.diagnostics.position_loss import PositionLoss
from gpt_lit.diagnostics.samples import Samples
from gpt_lit.diagnostics.throughput import Throughput

__all__ = ["AttentionMaps", "BlockGradNorms", "ChapterFigures", "LogitLens", "PositionLoss", "PositionSimilarity",
           "ResidualStream", "RunsTable", "Samples", "Throughput", "UnigramBaseline"]  # fmt: skip
