"""The chapter's GPT, in one file: "4 — The transformer block", in plain PyTorch, to read next to the book.

The chapter's classes in its order, names, fields and defaults, then ``count_params`` and ``generate``; created in
that order and initialised afterwards, so ``torch.manual_seed(123); GPT(GPTConfig())`` gives the chapter's weights.
For the diagnostics: ``CausalSelfAttention.weights`` and ``GPT.hidden_states`` (the stream before the final norm).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    """The model's sizes. ``GPTConfig()`` is GPT-2 124M; the chapter's experiments shrink it.

    Args:
        vocab_size: GPT-2 BPE vocabulary (linked from the data's tokenizer in the CLI).
        context_length: Longest sequence the position table covers (linked from data.context_length).
        emb_dim: Width of every token vector; must be divisible by n_heads.
        n_layers: Transformer blocks.
        n_heads: Attention heads per block.
        dropout: Dropout probability, used only while training; in [0, 1).
        qkv_bias: Biases on the q, k, v projections (GPT-2 has them).
        tie_weights: Share the token embedding and the output head (GPT-2 does; 124,439,808 parameters).
        residual: Residual connections; False is the chapter's "without" experiment.
    """

    vocab_size: int = 50257  # GPT-2 BPE vocabulary
    context_length: int = 1024  # longest sequence the position table covers
    emb_dim: int = 768  # width of every token vector
    n_layers: int = 12  # transformer blocks
    n_heads: int = 12  # attention heads per block
    dropout: float = 0.1  # used only while training
    qkv_bias: bool = True  # GPT-2 has biases on the q, k, v projections
    tie_weights: bool = False  # share token embedding and output head?
    residual: bool = True  # residual connections; False is the chapter's "without" experiment

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "emb_dim", "n_layers", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.emb_dim % self.n_heads:
            raise ValueError(
                f"GPTConfig.emb_dim ({self.emb_dim}) must be divisible by GPTConfig.n_heads "
                f"({self.n_heads}): each head gets emb_dim // n_heads numbers"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")


class LayerNorm(nn.Module):
    """LayerNorm(x)_i = gamma_i * (x_i - mean) / sqrt(var + eps) + beta_i over the last dimension, the biased variance:
    the chapter's written-out form, which ``F.layer_norm`` computes in one fused kernel (tests check they agree)."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))  # learned scale, gamma
        self.bias = nn.Parameter(torch.zeros(d))  # learned shift, beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class GELU(nn.Module):
    """GELU, GPT-2's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), ``F.gelu``'s fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


class FeedForward(nn.Module):
    """Per-position network: emb_dim -> 4 * emb_dim -> GELU -> emb_dim."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.emb_dim, 4 * cfg.emb_dim)
        self.act = GELU()
        self.proj = nn.Linear(4 * cfg.emb_dim, cfg.emb_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class CausalSelfAttention(nn.Module):
    """Chapter 3's causal multi-head attention: one fused ``qkv`` projection (q, k, v side by side, heads of head_dim
    consecutive numbers, GPT-2's layout), scores scaled by 1/sqrt(head_dim), the causal mask, softmax, dropout,
    then ``proj``. ``forward`` runs it as PyTorch's fused attention (SDPA); ``weights`` writes the weights out.
    ``context_length`` is in chapter 3's signature, where it sizes the mask; ``is_causal`` makes it here."""

    def __init__(self, d_in: int, n_heads: int, context_length: int, dropout: float, qkv_bias: bool = True):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_in // n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_in, 3 * d_in, bias=qkv_bias)
        self.proj = nn.Linear(d_in, d_in)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of every head: (B, T, emb_dim) -> 3 x (B, n_heads, T, head_dim)."""
        B, T, C = x.shape  # (batch, tokens, emb_dim)
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 x (B, T, C)
        return tuple(t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, emb_dim) -> (B, T, emb_dim)
        B, T, C = x.shape
        q, k, v = self.heads(x)  # 3 x (B, n_heads, T, head_dim)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, n_heads, T, head_dim)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # heads side by side again, then projected

    @torch.no_grad()
    def weights(self, x: torch.Tensor) -> torch.Tensor:
        """Each head's weights softmax(Q K^T / sqrt(head_dim) + mask), written out: (B, T, emb_dim) -> (B, n_heads, T,
        T) in fp32, row t spread over positions 0 .. t. Without dropout, ``proj`` of them times V is ``forward``."""
        T = x.shape[1]
        q, k, _ = self.heads(x)  # (B, n_heads, T, head_dim) each
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, n_heads, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)  # (T, T): key after query
        return torch.softmax(scores.float().masked_fill(future, -math.inf), dim=-1)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + ffn(norm2(x)); without ``residual``, the plain stack."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.residual = cfg.residual
        self.norm1 = LayerNorm(cfg.emb_dim)
        self.attn = CausalSelfAttention(cfg.emb_dim, cfg.n_heads, cfg.context_length, cfg.dropout, cfg.qkv_bias)
        self.norm2 = LayerNorm(cfg.emb_dim)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        if self.residual:
            x = x + self.drop(self.attn(self.norm1(x)))
            x = x + self.drop(self.ffn(self.norm2(x)))
        else:
            x = self.drop(self.attn(self.norm1(x)))
            x = self.drop(self.ffn(self.norm2(x)))
        return x


class GPT(nn.Module):
    """Token + position embeddings, n_layers blocks, a final layer norm and the output head."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.emb_dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layers)])
        self.final_norm = LayerNorm(cfg.emb_dim)
        self.head = nn.Linear(cfg.emb_dim, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """The residual stream at the output of the block stack, before the final norm: (B, T) -> (B, T, emb_dim)."""
        B, T = idx.shape
        if T > self.cfg.context_length:
            raise ValueError(
                f"sequence of {T} tokens is longer than context_length={self.cfg.context_length}, the "
                f"position table's size; crop it to the last {self.cfg.context_length} tokens"
            )
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, emb_dim)
        return self.blocks(x)  # (B, T, emb_dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) token IDs -> (B, T, vocab_size) logits
        return self.head(self.final_norm(self.hidden_states(idx)))


def count_params(model: nn.Module) -> int:
    """Number of parameters, each tensor once (a tied head is not counted twice)."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Append ``max_new_tokens`` tokens to ``idx`` (B, T), feeding at most the last context_length tokens: greedy (the
    chapter's) at ``temperature=0``, else sampled from softmax(logits / temperature), from the ``top_k`` likeliest."""
    model.eval()
    for _ in range(max_new_tokens):
        h = model.hidden_states(idx[:, -model.cfg.context_length :])[:, -1]  # (B, emb_dim): the last position's
        logits = model.head(model.final_norm(h))  # (B, vocab_size)
        if temperature <= 0.0:
            next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
                logits = logits.masked_fill(logits < kth, -math.inf)
            next_id = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)  # (B, 1)
        idx = torch.cat([idx, next_id], dim=1)
    return idx
