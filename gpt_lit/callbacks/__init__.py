"""The chapter's diagnostics, each its own small Callback, plus the predict writer."""

from gpt_lit.callbacks.grad_norms import BlockGradNorms
from gpt_lit.callbacks.predictions import ContinuationWriter
from gpt_lit.callbacks.similarity import PositionSimilarity, mean_position_similarity
from gpt_lit.callbacks.unigram import UnigramBaseline, unigram_entropy

__all__ = [
    "BlockGradNorms",
    "ContinuationWriter",
    "PositionSimilarity",
    "UnigramBaseline",
    "mean_position_similarity",
    "unigram_entropy",
]
