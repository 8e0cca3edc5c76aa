"""gpt_lit: the GPT of "4 — The transformer block" as a PyTorch Lightning project."""

from gpt_lit.model import GPT, GPTConfig, count_params, generate

__all__ = ["GPT", "GPTConfig", "count_params", "generate"]
