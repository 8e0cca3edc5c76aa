"""What the model writes as it learns: greedy continuations of fixed prompts in TensorBoard's Text tab."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt_lit.callbacks.after_validation import AfterValidation, Validation
from gpt_lit.callbacks.probe import diagnostic_threads
from gpt_lit.callbacks.tensorboard_log import is_fresh_start, tensorboard_writers
from gpt_lit.distributed import shards_parameters
from gpt_lit.errors import GptLitError
from gpt_lit.model import GPT, CausalSelfAttention, generate
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
    matrix read whole for every new token, runs on the last positions only (``generate`` reads nothing else).

    Each block's keys and values are kept (a KV cache): when a call's rows are the last call's plus one token
    each, the blocks run on that token alone, its attention reading the kept keys and values up to its
    position, instead of on every token again. Any other call (the first, or once ``generate`` crops the
    rows to the context and every position moves) runs the whole rows and keeps their keys and values.
    """

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt, self.cfg = gpt, gpt.cfg
        self.seen: torch.Tensor | None = None  # (B, T) the last call's rows
        self.keys: list[torch.Tensor] = []  # per block, (B, n_heads, context_length, head_dim)
        self.values: list[torch.Tensor] = []  # the same for the values
        self.lengths: torch.Tensor | None = None  # (B,) tokens of each row in the cache

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seen, self.seen = self.seen, idx
        extends = seen is not None and idx.shape[1] == seen.shape[1] + 1 and torch.equal(idx[:, :-1], seen)
        if extends and int(self.lengths.max()) < self.cfg.context_length:
            hidden = self.next_token(idx[:, -1:])  # (B, 1, emb_dim)
        else:
            hidden = self.whole_rows(idx)  # (B, 1, emb_dim)
        return self.gpt.head(self.gpt.final_norm(hidden))  # (B, 1, vocab_size)

    def whole_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Every row from position 0, its keys and values kept: the stream at each row's last token, (B, 1, C)."""
        B, T = idx.shape
        lengths = (idx != PAD).sum(dim=1)  # (B,) each row's tokens, all at its right end
        cols = (torch.arange(T, device=idx.device) + (T - lengths)[:, None]).clamp(max=T - 1)  # (B, T)
        aligned = idx.gather(1, cols)  # (B, T): each row's tokens from position 0, then its last token repeated
        self.keys, self.values, self.lengths = [], [], lengths
        hooks = [blk.attn.register_forward_hook(self.keep) for blk in self.gpt.blocks]
        try:
            hidden = self.gpt.hidden_states(aligned)  # (B, T, emb_dim)
        finally:
            for hook in hooks:
                hook.remove()
        return hidden[torch.arange(B, device=idx.device), lengths - 1][:, None]  # (B, 1, emb_dim)

    def keep(self, attn: CausalSelfAttention, args: tuple, _out: torch.Tensor) -> None:
        """A forward hook on each block's attention in ``whole_rows``: keep the keys and values of its input."""
        _, k, v = attn.heads(args[0])  # (B, n_heads, T, head_dim) each
        shape = (*k.shape[:2], self.cfg.context_length, k.shape[-1])
        self.keys.append(k.new_zeros(shape).index_copy_(2, torch.arange(k.shape[2], device=k.device), k))
        self.values.append(v.new_zeros(shape).index_copy_(2, torch.arange(v.shape[2], device=v.device), v))

    def next_token(self, new: torch.Tensor) -> torch.Tensor:
        """The blocks on each row's one new token (B, 1) at position ``lengths``: its stream, (B, 1, emb_dim)."""
        gpt, pos = self.gpt, self.lengths  # (B,) the new token's position in each row
        x = gpt.drop(gpt.tok_emb(new) + gpt.pos_emb(pos)[:, None])  # (B, 1, emb_dim), as hidden_states makes it
        visible = torch.arange(self.cfg.context_length, device=new.device) <= pos[:, None]  # (B, context_length)
        rows = torch.arange(len(new), device=new.device)
        blocks = list(gpt.blocks)

        def cached(i: int):  # replaces block i's attention output: the new token attends to the kept keys
            def hook(attn: CausalSelfAttention, args: tuple, _out: torch.Tensor) -> torch.Tensor:
                q, k, v = attn.heads(args[0])  # (B, n_heads, 1, head_dim) each
                self.keys[i][rows, :, pos] = k[:, :, 0]
                self.values[i][rows, :, pos] = v[:, :, 0]
                mask = visible[:, None, None, :]  # (B, 1, 1, context_length): the row's keys up to the token
                y = F.scaled_dot_product_attention(q, self.keys[i], self.values[i], attn_mask=mask)  # (B, nh, 1, hd)
                return attn.proj(y.transpose(1, 2).reshape(*args[0].shape))  # (B, 1, emb_dim)

            return hook

        hooks = [blk.attn.register_forward_hook(cached(i)) for i, blk in enumerate(blocks)]
        try:
            x = gpt.blocks(x)  # each block's own norms, feed-forward and residual sums
        finally:
            for hook in hooks:
                hook.remove()
        self.lengths = pos + 1
        return x


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
