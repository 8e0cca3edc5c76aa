"""What the model writes as it learns: greedy continuations of fixed prompts in TensorBoard's Text tab."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn as nn
from lightning.pytorch.callbacks import Callback

from gpt_lit.callbacks.probe import diagnostic_threads
from gpt_lit.callbacks.tensorboard_log import epoch_end_step, is_fresh_start, shards_parameters, tensorboard_writer
from gpt_lit.errors import GptLitError
from gpt_lit.model import GPT, generate
from gpt_lit.tokenizer import get_tokenizer


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
    (copies of it) cannot change that token's output, as attention is causal. One pass serves every prompt,
    and the output head, a 256 x 50257 matrix read whole for every new token, runs once for all of them, on
    the last positions only (``generate`` reads nothing else).
    """

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt, self.cfg = gpt, gpt.cfg

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        lengths = (idx != PAD).sum(dim=1)  # (B,) each row's tokens, all at its right end
        cols = (torch.arange(T, device=idx.device) + (T - lengths)[:, None]).clamp(max=T - 1)  # (B, T)
        aligned = idx.gather(1, cols)  # (B, T): each row's tokens from position 0, then its last token repeated
        hidden = self.gpt.hidden_states(aligned)  # (B, T, emb_dim)
        last = hidden[torch.arange(B, device=idx.device), lengths - 1]  # (B, emb_dim)
        return self.gpt.head(self.gpt.final_norm(last))[:, None, :]  # (B, 1, vocab_size)


def padded_prompts(prompts: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """The prompts' token IDs as one (B, longest) tensor, each row filled on the left with ``PAD``."""
    longest = max(len(ids) for ids in prompts)
    return torch.tensor([[PAD] * (longest - len(ids)) + ids for ids in prompts], device=device)


class Samples(Callback):
    def __init__(self, prompts: list[str] | None = None, max_new_tokens: int = 30):
        """Log each prompt's greedy continuation to the Text tab at the start and after every epoch.

        One tag per prompt, ``samples/<prompt>``, one entry per epoch at the step of ``loss/val``, so the
        Text tab shows gibberish turning into Wells. Uses the chapter's ``generate`` (greedy: argmax, no
        random numbers drawn), in eval mode, then puts the model's training mode back; the global random
        state is untouched, so resumed runs stay exact. On the main process only; skipped, with one logged
        line, under strategies that shard the parameters.

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
            prompts = [enc.encode(prompt, allowed_special="all") for prompt in self.prompts]
            with diagnostic_threads():  # 30 small sequential forward passes: one thread if the CPU is shared
                # the chapter's greedy loop, every prompt at once
                out = generate(
                    LastPositionLogits(model), padded_prompts(prompts, pl_module.device), self.max_new_tokens
                )
            return [enc.decode([t for t in row if t != PAD]) for row in out.tolist()]
        finally:
            model.train(was_training)  # generate() switches the model to eval mode and leaves it there

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        writer = tensorboard_writer(trainer)
        if writer is None or not self.active:
            return
        for prompt, text in zip(self.prompts, self.continuations(pl_module), strict=True):
            writer.add_text(f"samples/{prompt}", sample_markdown(prompt, text), step)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.active = not shards_parameters(trainer, "Samples")
        if is_fresh_start(trainer):  # a resumed run logged its start already
            self._log(trainer, pl_module, 0)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module, epoch_end_step(trainer))
