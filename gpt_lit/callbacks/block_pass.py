"""One pass of the model over a batch, recording what every block reads and writes: the probes share it."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

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

    def rows(self, n: int) -> BlockRecord:
        """The record of the batch's first ``n`` sequences (each sequence's pass is independent of the others)."""
        if n == len(self.tokens):
            return self
        parts = {name: [t[:n] for t in getattr(self, name)] for name in RECORDED}
        return BlockRecord(self.tokens[:n], **parts)


RECORDED = ("attn_in", "attn_x", "attn_out", "ffn_in", "ffn_out", "block_out")


@torch.no_grad()
def record_blocks(model: GPT, idx: torch.Tensor) -> BlockRecord:
    """One pass of ``model.hidden_states`` on the token IDs ``idx`` (B, T), with forward hooks on every block, its
    norms, its attention and its feed-forward; in whatever mode the model is in."""
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


class SharedPass:
    """The last ``record_blocks`` of one moment (a model, at a step of an epoch), handed to every probe of that
    moment that asks for the same windows or fewer: the similarity, attention, stream and lens probes of an
    epoch's end all read the first windows of the validation set, and one pass serves them all. ``clear`` drops it
    (the probes clear it when training resumes).

    The model is held by a weak reference, not by ``id``: a model made after the recorded one was freed may get
    its ``id``, and would be handed the other model's record."""

    def __init__(self) -> None:
        self.model: weakref.ref[GPT] | None = None
        self.moment: tuple | None = None
        self.record: BlockRecord | None = None

    def __call__(self, model: GPT, idx: torch.Tensor, moment: tuple) -> BlockRecord:
        n, record = len(idx), self.record
        same = self.model is not None and self.model() is model and self.moment == moment
        if same and record is not None and len(record.tokens) >= n:
            if record.tokens.shape[1:] == idx.shape[1:] and torch.equal(record.tokens[:n], idx):
                return record.rows(n)
        self.model, self.moment, self.record = weakref.ref(model), moment, record_blocks(model, idx)
        return self.record

    def clear(self) -> None:
        self.model = self.moment = self.record = None


SHARED_PASS = SharedPass()  # one per process, as the probes of one run share it
