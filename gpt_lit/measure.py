"""The chapter's measurements as plain functions of a ``GPT`` and token IDs (or ``record_blocks``' record of a pass),
without a Trainer (a notebook calls them on ``last.ckpt``'s model); torch and the chapter's model only."""

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
    """One pass of ``model.hidden_states`` on ``idx`` (B, T), recorded by forward hooks, in the model's mode."""
    record = BlockRecord(idx)

    def keep(name: str, use_input: bool):
        return lambda _m, args, out: getattr(record, name).append(args[0] if use_input else out)

    taps = {"attn_in": ("norm1", True), "attn_x": ("norm1", False), "attn_out": ("attn", False),
            "ffn_in": ("norm2", True), "ffn_out": ("ffn", False), "block_out": ("", False)}  # fmt: skip
    hooks = [blk.get_submodule(module).register_forward_hook(keep(name, use_input))  # the module's input or output
             for blk in model.blocks for name, (module, use_input) in taps.items()]  # fmt: skip
    try:
        model.hidden_states(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return record


@torch.no_grad()
def attention_weights(model: GPT, record: BlockRecord) -> list[torch.Tensor]:
    """Each block's softmax(Q K^T / sqrt(head_dim) + mask), (B, n_heads, T, T) in fp32, from the recorded inputs."""
    return [blk.attn.weights(x) for blk, x in zip(model.blocks, record.attn_x, strict=True)]


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Each attention row's entropy -sum_j w_j log w_j in nats (0: one token; log t: t tokens evenly)."""
    return -torch.special.xlogy(weights, weights).sum(dim=-1)


def token_rms(x: torch.Tensor) -> torch.Tensor:
    """Each vector's root-mean-square sqrt(mean_c x_c^2): (..., emb_dim) -> (...), in fp32."""
    return x.float().square().mean(dim=-1).sqrt()


def batch_rms(sizes: torch.Tensor) -> torch.Tensor:
    """From ``token_rms`` sizes (..., B, T), the RMS over the whole batch: (...)."""
    return sizes.square().mean(dim=(-2, -1)).sqrt()


def stream_sizes(record: BlockRecord) -> torch.Tensor:
    """The RMS of the stream after each block: (n_layers, B, T)."""
    return torch.stack([token_rms(x) for x in record.block_out])


def write_sizes(record: BlockRecord) -> tuple[torch.Tensor, torch.Tensor]:
    """The RMS of the attention's and the feed-forward's outputs: (n_layers, B, T) each."""
    return torch.stack([token_rms(x) for x in record.attn_out]), torch.stack([token_rms(x) for x in record.ffn_out])


def update_ratios(record: BlockRecord) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block, each sub-layer's write's RMS over the RMS of the stream it reads, over the batch: (n_layers,) each."""
    reads = (torch.stack([token_rms(x) for x in xs]) for xs in (record.attn_in, record.ffn_in))
    return tuple(batch_rms(write) / batch_rms(read) for write, read in zip(write_sizes(record), reads, strict=True))


@torch.no_grad()
def lens_logits(model: GPT, record: BlockRecord, block: int) -> torch.Tensor:
    """The logit lens: the stream after block ``block`` (0-based) through the final norm and the head, (B, T, V)."""
    return model.head(model.final_norm(record.block_out[block]))


@torch.no_grad()
def lens_losses(model: GPT, record: BlockRecord, targets: torch.Tensor) -> torch.Tensor:
    """Each token's loss against ``targets`` (B, T) of the logit lens after each block: (n_layers, B, T)."""
    streams = torch.cat([model.final_norm(out).flatten(0, 1) for out in record.block_out])  # (n_layers * B * T, C)
    losses = vocab_blocked_token_losses(streams, model.head.weight, targets.flatten().repeat(len(record.block_out)))
    return losses.view(len(record.block_out), *targets.shape)


@torch.no_grad()
def token_losses(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each token's cross-entropy -log softmax(model(idx))[target]: (B, T)."""
    hidden = model.final_norm(model.hidden_states(idx)).flatten(0, 1)  # (B * T, C)
    return vocab_blocked_token_losses(hidden, model.head.weight, targets.flatten()).view_as(targets)


def position_similarity(hidden: torch.Tensor) -> torch.Tensor:
    """Each sequence's mean cosine similarity over pairs of positions i != j: (B, T, C) -> (B,); 1: all alike."""
    T = hidden.shape[1]
    unit = F.normalize(hidden.float(), dim=-1)  # (B, T, C)
    sims = unit @ unit.transpose(1, 2)  # (B, T, T)
    return (sims.sum(dim=(1, 2)) - sims.diagonal(dim1=1, dim2=2).sum(dim=1)) / (T * (T - 1))


def position_means(losses: torch.Tensor) -> torch.Tensor:
    """The loss at each position (p predicts token p + 1 from p tokens), over the sequences: (B, T) -> (T,)."""
    return losses.float().mean(dim=0)


def octave_means(losses: list[float]) -> tuple[list[float], list[float]]:
    """The mean loss over positions 1, 2-3, 4-7, ... (the last octave to the end), at each one's geometric middle."""
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
    """The unigram floor: the entropy -sum p log p of the token frequencies in ``ids``, in nats."""
    counts = torch.bincount(ids.flatten())
    p = counts[counts > 0].double() / counts.sum()
    return float(-(p * p.log()).sum())
