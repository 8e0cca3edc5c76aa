"""The greedy samples in TensorBoard's Text tab, and the predict writer."""

from gpt_lit.callbacks.predictions import ContinuationWriter
from gpt_lit.callbacks.samples import Samples

__all__ = ["ContinuationWriter", "Samples"]
