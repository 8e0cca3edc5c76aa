"""The chapter's diagnostics: what TensorBoard shows of a run, each a small Lightning Callback listed in a config's
``trainer.callbacks`` as ``gpt_lit.diagnostics.X``.

Each one measures with ``gpt_lit.measure`` (plain functions of a model, which a notebook can call too), logs its
scalars with ``pl_module.log`` from a validation hook (Lightning gives the step and every logger) and hands its
figures to the TensorBoard logger's writer (``add_figure``, ``add_image``). ``figures.py`` draws them all over
plain matplotlib; ``probe.py`` holds what they share: the step of a validation, where figures go, and ``Probe``, a
diagnostic that runs the model on fixed validation windows. These modules import torch, Lightning, matplotlib,
TensorBoard and the chapter's modules (gpt_lit/*.py), never gpt_lit/run/; only the configs and the tests import
them.
"""

from gpt_lit.diagnostics.attention import AttentionMaps
from gpt_lit.diagnostics.grad_norms import BlockGradNorms
from gpt_lit.diagnostics.lens import LogitLens
from gpt_lit.diagnostics.losses import ChapterFigures
from gpt_lit.diagnostics.position_loss import PositionLoss
from gpt_lit.diagnostics.runs_table import RunsTable
from gpt_lit.diagnostics.samples import Samples
from gpt_lit.diagnostics.similarity import PositionSimilarity
from gpt_lit.diagnostics.stream import ResidualStream
from gpt_lit.diagnostics.throughput import Throughput
from gpt_lit.diagnostics.unigram import UnigramBaseline

__all__ = [
    "AttentionMaps",
    "BlockGradNorms",
    "ChapterFigures",
    "LogitLens",
    "PositionLoss",
    "PositionSimilarity",
    "ResidualStream",
    "RunsTable",
    "Samples",
    "Throughput",
    "UnigramBaseline",
]
