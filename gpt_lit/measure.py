"""The chapter's measurements of a model, as plain functions: what each block reads and writes, the attention
weights and their entropy, the size of the residual stream and of each sub-layer's write, the logit lens, each
token's loss, the similarity between positions, the loss by position and the unigram floor.

They take a ``GPT`` and token IDs (or what ``record_blocks`` recorded of one pass) and return tensors; none needs
a Trainer, so a notebook calls them on a model loaded from ``last.ckpt``. The diagnostics (gpt_lit/diagnostics/)
log and draw what these return. Torch and the chapter's model only: nothing of Lightning here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gpt_lit.loss import vocab_blocked_token_losses
from gpt_lit.model import GPT


@dataclass
class BlockRecord:
    """What each block of one pass read and wrote, a list over blocks 1 .. n_layers of (B, T, emb_dim) tensors."""

    tokens: torch.Tensor  # (B, T) the token IDs the pass ran on
    attn_in: list[torch.Tensor] = field(default_factory=list)  # the stream the attention reads (norm1's input)
    attn_x: list[torch.Tensor] = field(default_factory=list)  # the attention's input (norm1's output)
    attn_out: list[torch.Tensor] = field(default_factory=list)  # the attention's output
    ffn_in: list[torch.Tensor] = field(default_factory=list)  # the stream the feed-forward reads (norm2's input)
    ffn_out: list[torch.Tensor] = field(default_factory=list)  # the feed-forward's output
    block_out: list[torch.Tensor] = field(default_factory=list)  # the stream after the block


@torch.no_grad()
def record_blocks(model: GPT, idx: torch.Tensor) -> BlockRecord:
    """One pass of ``model.hidden_states`` on the token IDs ``idx`` (B, T), with forward hooks on every block, its
    norms, its attention and its feed-forward; in whatever mode the model is in (eval: no dropout)."""
    record = BlockRecord(idx)

    def keep(name: str, use_input: bool):
        return lambda _m, args, out: getattr(record, name).append(args[0] if use_input else out)

    hooks = []
    for blk in model.blocks:
        hooks += [
            blk.norm1.register_forward_hook(keep("attn_in", True)),
            blk.norm1.register_forward_hook(keep("attn_x", False)),
            blk.attn.register_forward_hook(keep("attn_out", False)),
            blk.norm2.register_forward_hook(keep("ffn_in", True)),
            blk.ffn.register_forward_hook(keep("ffn_out", False)),
            blk.register_forward_hook(keep("block_out", False)),
        ]
    try:
        model.hidden_states(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return record


@torch.no_grad()
def attention_weights(model: GPT, record: BlockRecord) -> list[torch.Tensor]:
    """Each block's attention weights softmax(Q K^T / sqrt(head_dim) + mask), (B, n_heads, T, T) in fp32, from the
    attention inputs the pass recorded (``CausalSelfAttention.weights``). Row t spreads over positions 0 .. t."""
    return [blk.attn.weights(x) for blk, x in zip(model.blocks, record.attn_x, strict=True)]


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy, in nats, of each attention row: -sum_j w_j log w_j (0 log 0 = 0), shape ``weights.shape[:-1]``.
    0: the row looks at one token; log t: spread evenly over t tokens."""
    return -torch.special.xlogy(weights, weights).sum(dim=-1)


def token_rms(x: torch.Tensor) -> torch.Tensor:
    """The root-mean-square of each token's vector, sqrt(mean_c x_c^2): (..., emb_dim) -> (...), in fp32."""
    return x.float().square().mean(dim=-1).sqrt()


def batch_rms(sizes: torch.Tensor) -> torch.Tensor:
    """From ``token_rms`` sizes (..., B, T), the RMS of every number of the batch's vectors: (...)."""
    return sizes.square().mean(dim=(-2, -1)).sqrt()


@torch.no_grad()
def stream_sizes(record: BlockRecord) -> torch.Tensor:
    """The size (RMS, ``token_rms``) of the stream after each block: (n_layers, B, T)."""
    return torch.stack([token_rms(x) for x in record.block_out])


@torch.no_grad()
def write_sizes(record: BlockRecord) -> tuple[torch.Tensor, torch.Tensor]:
    """The size (RMS) of what each sub-layer writes: the attention's output and the feed-forward's, (n_layers, B, T)
    each."""
    return torch.stack([token_rms(x) for x in record.attn_out]), torch.stack([token_rms(x) for x in record.ffn_out])


@torch.no_grad()
def update_ratios(record: BlockRecord) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block, the RMS of each sub-layer's write over the RMS of the stream it reads, over the whole batch:
    (attention, feed-forward), (n_layers,) each. 0.1: it nudges the stream; 1: it writes as much as is there.
    Without residuals the write replaces the stream: the ratio is its output's size over its input's."""
    attn, ffn = (batch_rms(sizes) for sizes in write_sizes(record))
    read_attn = batch_rms(torch.stack([token_rms(x) for x in record.attn_in]))
    read_ffn = batch_rms(torch.stack([token_rms(x) for x in record.ffn_in]))
    return attn / read_attn, ffn / read_ffn


@torch.no_grad()
def lens_logits(model: GPT, record: BlockRecord, block: int) -> torch.Tensor:
    """The logit lens: the stream after block ``block`` (0-based) read out through the final norm and the head,
    (B, T, vocab_size). After the last block it is ``model(idx)``."""
    return model.head(model.final_norm(record.block_out[block]))


@torch.no_grad()
def lens_losses(model: GPT, record: BlockRecord, targets: torch.Tensor) -> torch.Tensor:
    """Each token's loss against ``targets`` (B, T) when the stream after each block is read out through the final
    norm and the head: (n_layers, B, T). The last block's row is the model's own ``token_losses``."""
    streams = torch.cat([model.final_norm(out).flatten(0, 1) for out in record.block_out])  # (n_layers * B * T, C)
    losses = vocab_blocked_token_losses(streams, model.head.weight, targets.flatten().repeat(len(record.block_out)))
    return losses.view(len(record.block_out), *targets.shape)


@torch.no_grad()
def token_losses(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each token's cross-entropy -log softmax(model(idx))[target], (B, T), for the token IDs ``idx`` (B, T)."""
    hidden = model.final_norm(model.hidden_states(idx)).flatten(0, 1)  # (B * T, C)
    return vocab_blocked_token_losses(hidden, model.head.weight, targets.flatten()).view_as(targets)


def position_similarity(hidden: torch.Tensor) -> torch.Tensor:
    """Each sequence's mean cosine similarity over all pairs of different positions i != j: (B, T, C) -> (B,).
    1: every position is the same vector. The chapter measures it on the stream at the top of the stack."""
    T = hidden.shape[1]
    unit = F.normalize(hidden.float(), dim=-1)  # (B, T, C)
    sims = unit @ unit.transpose(1, 2)  # (B, T, T)
    return (sims.sum(dim=(1, 2)) - sims.diagonal(dim1=1, dim2=2).sum(dim=1)) / (T * (T - 1))


def position_means(losses: torch.Tensor) -> torch.Tensor:
    """The loss at each position, averaged over the sequences: (B, T) -> (T,). Position p (1-based) predicts a
    window's token p + 1 from its first p tokens."""
    return losses.float().mean(dim=0)


def octave_means(losses: list[float]) -> tuple[list[float], list[float]]:
    """The mean loss over positions 1, 2-3, 4-7, 8-15, ... (the last octave up to the end), at each one's middle
    (geometric). One position's loss averages one token per window, so it is noisy; an octave's mean is not."""
    centres, means, lo = [], [], 1
    while lo <= len(losses):
        hi = 2 * lo - 1
        if 2 * (hi + 1) > len(losses):  # the last octave runs to the end (64-128, not 64-127 and 128)
            hi = len(losses)
        centres.append((lo * hi) ** 0.5)
        means.append(sum(losses[lo - 1 : hi]) / (hi - lo + 1))
        lo = hi + 1
    return centres, means


def unigram_entropy(ids: torch.Tensor) -> float:
    """The unigram floor: the entropy, in nats, of the token frequencies in ``ids``, -sum p log p over the tokens
    that occur; the loss of a model that ignores context."""
    counts = torch.bincount(ids.flatten())
    p = counts[counts > 0].double() / counts.sum()
    return float(-(p * p.log()).sum())
