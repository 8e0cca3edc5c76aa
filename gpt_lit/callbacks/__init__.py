"""The chapter's diagnostics, each its own small Callback; the predict writer."""

from gpt_lit.callbacks.attention import AttentionMaps, block_attentions, row_entropy
from gpt_lit.callbacks.figures import ChapterFigures
from gpt_lit.callbacks.grad_norms import BlockGradNorms
from gpt_lit.callbacks.logit_lens import LogitLens, lens_losses
from gpt_lit.callbacks.position_loss import PositionLoss
from gpt_lit.callbacks.predictions import ContinuationWriter
from gpt_lit.callbacks.runs_table import RunsTable
from gpt_lit.callbacks.samples import Samples
from gpt_lit.callbacks.similarity import PositionSimilarity, block_similarities, mean_position_similarity
from gpt_lit.callbacks.stream import ResidualStream, stream_sizes
from gpt_lit.callbacks.throughput import Throughput
from gpt_lit.callbacks.unigram import UnigramBaseline, unigram_entropy

__all__ = [
    "AttentionMaps",
    "BlockGradNorms",
    "ChapterFigures",
    "ContinuationWriter",
    "LogitLens",
    "PositionLoss",
    "PositionSimilarity",
    "ResidualStream",
    "RunsTable",
    "Samples",
    "Throughput",
    "UnigramBaseline",
    "block_attentions",
    "block_similarities",
    "lens_losses",
    "mean_position_similarity",
    "row_entropy",
    "stream_sizes",
    "unigram_entropy",
]
