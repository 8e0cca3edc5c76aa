"""What the model writes as it learns: greedy continuations of fixed prompts in TensorBoard's Text tab."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn as nn

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.probe import diagnostic_threads
from gpt_lit.callbacks.tensorboard_log import is_fresh_start, tensorboard_writers
from gpt_lit.distributed import shards_parameters
from gpt_lit.errors import GptLitError
from gpt_lit.model import GPT, KVCache, generate
from gpt_lit.tokenizer import encode, get_tokenizer


def sample_markdown(prompt: str, text: str) -> str:
    """The Text tab's entry: the prompt in bold, then the whole text as one code line, each line break shown as ↵.

    An early model often writes nothing but line breaks; drawn as breaks, its entry would look empty.
    """
    return f"**{prompt}** →\n\n    {text.replace(chr(10), '↵')}"


PAD = -1  # fills the left of the shorter prompts: not a token ID


class LastPositionLogits(nn.Module):
    """The GPT as ``generate`` sees it, for a batch of prompts of different lengths: each row's logits for its last
    token, (B, 1, vocab_size), as the GPT run on that row alone would give them.

    The rows come left-filled with ``PAD`` (``generate`` appends each row's next token on the right and crops
    on the left). Each row is moved to start at position 0, as it would alone; what follows its last token
    (copies of it) cannot change that token's output, as attention is causal. The output head, a 256 x 50257
    matrix read whole for every new token, runs on the last positions only (``generate`` reads nothing else),
    as a matrix-times-vectors product.

    The model's ``KVCache`` keeps each block's keys and values: when a call's rows are the last call's plus one
    token each, the blocks run on that token alone, at each row's own position. Any other call (the first, or
    once ``generate`` crops the rows to the context and every position moves) runs the whole rows and keeps
    their keys and values.
    """

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt, self.cfg = gpt, gpt.cfg
        self.seen: torch.Tensor | None = None  # (B, T) the last call's rows
        self.cache: KVCache | None = None  # the keys and values of the rows so far; its pos: each row's length

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seen, self.seen = self.seen, idx
        extends = seen is not None and idx.shape[1] == seen.shape[1] + 1 and torch.equal(idx[:, :-1], seen)
        if extends and int(self.cache.pos.max()) < self.cfg.context_length:
            hidden = self.gpt.hidden_states(idx[:, -1:], self.cache)  # (B, 1, emb_dim): the new tokens alone
        else:
            hidden = self.whole_rows(idx)  # (B, 1, emb_dim)
        normed = self.gpt.final_norm(hidden)[:, 0]  # (B, emb_dim)
        # The head as (vocab_size, C) @ (C, B): the weight read row by row, faster on a CPU than the head's own
        # (B, C) @ (C, vocab_size) for a few rows (docs/performance.md).
        # The same logits to float rounding (1e-5).
        return (self.gpt.head.weight @ normed.T).T[:, None]  # (B, 1, vocab_size); the head has no bias

    def whole_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Every row from position 0, its keys and values kept: the stream at each row's last token, (B, 1, C)."""
        B, T = idx.shape
        lengths = (idx != PAD).sum(dim=1)  # (B,) each row's tokens, all at its right end
        cols = (torch.arange(T, device=idx.device) + (T - lengths)[:, None]).clamp(max=T - 1)  # (B, T)
        aligned = idx.gather(1, cols)  # (B, T): each row's tokens from position 0, then its last token repeated
        self.cache = KVCache(self.cfg.n_layers)
        hidden = self.gpt.hidden_states(aligned, self.cache)  # (B, T, emb_dim)
        self.cache.pos = lengths  # each row's next token goes right after its own last one
        return hidden[torch.arange(B, device=idx.device), lengths - 1][:, None]  # (B, 1, emb_dim)


def padded_prompts(prompts: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """The prompts' token IDs as one (B, longest) tensor, each row filled on the left with ``PAD``."""
    longest = max(len(ids) for ids in prompts)
    return torch.tensor([[PAD] * (longest - len(ids)) + ids for ids in prompts], device=device)


class Samples(AfterValidation):
    def __init__(self, prompts: list[str] | None = None, max_new_tokens: int = 30):
        """Log each prompt's greedy continuation to the Text tab at the start and after every validation of ``fit``.

        One tag per prompt, ``samples/<prompt>``, one entry per validation at the step of its ``loss/val``, in every
        TensorBoard logger, so the Text tab shows gibberish turning into Wells. Uses the chapter's ``generate`` (greedy:
        argmax, no random numbers drawn), in eval mode, then puts the model's training mode back; the global random
        state is untouched, so resumed runs stay exact. On the main process only; skipped, with one logged line, under
        strategies that shard the parameters.

        Args:
            prompts: Texts to continue; default "The Time Traveller" and "I saw".
            max_new_tokens: Tokens generated after each prompt.
        """
        self.prompts = list(prompts) if prompts is not None else ["The Time Traveller", "I saw"]
        for n, prompt in enumerate(self.prompts, 1):
            if not prompt.strip():
                raise GptLitError(f"Samples: prompt {n} is empty: give every prompt some text to continue")
        if max_new_tokens < 1:
            raise GptLitError(f"Samples.max_new_tokens must be at least 1, got {max_new_tokens}")
        self.max_new_tokens = max_new_tokens
        self.active = True

    @torch.no_grad()
    def continuations(self, pl_module: L.LightningModule) -> list[str]:
        """Each prompt with its greedy continuation, decoded; the model's training mode is left as it was."""
        enc, model = get_tokenizer(), pl_module.model
        was_training = model.training
        try:
            prompts = [encode(prompt) for prompt in self.prompts]  # as data.prompts are
            with diagnostic_threads():  # 30 small sequential forward passes: one thread if the CPU is shared
                # the chapter's greedy loop, every prompt at once
                out = generate(
                    LastPositionLogits(model), padded_prompts(prompts, pl_module.device), self.max_new_tokens
                )
            return [enc.decode([t for t in row if t != PAD]) for row in out.tolist()]
        finally:
            model.train(was_training)  # generate() switches the model to eval mode and leaves it there

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        writers = tensorboard_writers(trainer)
        if not writers or not self.active:
            return
        for prompt, text in zip(self.prompts, self.continuations(pl_module), strict=True):
            for writer in writers:
                writer.add_text(f"samples/{prompt}", sample_markdown(prompt, text), step)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.active = not shards_parameters(trainer, "Samples")
        if is_fresh_start(trainer):  # a resumed run logged its start already
            self._log(trainer, pl_module, 0)

    def after_validation(self, trainer: L.Trainer, pl_module: L.LightningModule, validation: Validation) -> None:
        self._log(trainer, pl_module, validation.step)
