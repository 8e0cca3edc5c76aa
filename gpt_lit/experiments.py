"""The chapter's small experiments as functions, with the numbers the book prints beside them.

``scripts/reproduce_chapter.py`` prints these next to the book's values; ``tests/test_chapter_experiments.py``
checks the same functions, so what is printed is what is tested. Everything runs on gpt_lit's own classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from gpt_lit.loss import token_losses
from gpt_lit.measure import position_similarity, record_blocks
from gpt_lit.model import GELU, GPT, GPTConfig, LayerNorm, count_params, generate
from gpt_lit.tokenizer import get_tokenizer

# "Layer norm, on four numbers"
LAYERNORM_INPUT = [[2.0, 4.0, 6.0, 8.0], [1.0, 1.0, 1.0, 50.0]]
BOOK_LAYERNORM = [[-1.3416, -0.4472, 0.4472, 1.3416], [-0.5774, -0.5774, -0.5774, 1.7321]]

# "GELU, a softer ReLU"
GELU_XS = [-3.0, -2.0, -1.0, -0.5, -0.1, 0.0, 0.5, 1.0, 2.0, 3.0]
BOOK_RELU = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 2.0, 3.0]
BOOK_GELU = [-0.0036, -0.0454, -0.1588, -0.1543, -0.0460, 0.0, 0.3457, 0.8412, 1.9546, 2.9964]

# "Residual connections": gradient norm of each block's ffn.fc.weight, blocks 1..12, and position similarity
BOOK_GRAD_NORMS = {
    True: [0.91, 0.65, 0.52, 0.45, 0.40, 0.35, 0.31, 0.32, 0.29, 0.27, 0.26, 0.25],
    False: [1.22, 1.15, 1.19, 1.24, 1.33, 1.42, 1.38, 1.31, 1.24, 1.17, 0.99, 1.03],
}
BOOK_SIMILARITY = {(12, True): 0.563, (12, False): 1.000, (48, True): 0.731, (48, False): 1.000}

# "Counting the parameters": (part, shape as the book writes it, the book's count)
BOOK_PARAMETERS = [
    ("Token embedding", "50,257 × 768", 38_597_376),
    ("Position embedding", "1,024 × 768", 786_432),
    ("Per block: two layer norms", "2 × (768 + 768)", 3_072),
    ("Per block: attention, q k v", "768 × 2,304 + 2,304", 1_771_776),
    ("Per block: attention, output projection", "768 × 768 + 768", 590_592),
    ("Per block: feed-forward, expand", "768 × 3,072 + 3,072", 2_362_368),
    ("Per block: feed-forward, contract", "3,072 × 768 + 768", 2_360_064),
    ("One block, total", "", 7_087_872),
    ("12 blocks", "", 85_054_464),
    ("Final layer norm", "768 + 768", 1_536),
    ("Output head", "768 × 50,257", 38_597_376),
    ("Total", "", 163_037_184),
]
BOOK_TOTAL_UNTIED, BOOK_TOTAL_TIED = 163_037_184, 124_439_808
BOOK_BYTES_TIED = 497_759_232  # "just under 500 MB"; the untied model "would be 652 MB"

# "Asking an untrained model to write": seed 123, GPT(GPTConfig()), greedy, 12 new tokens
BOOK_CONTINUATIONS = {
    "The Time Traveller": "The Time Traveller preventionの� Const preventionの� needy Chris IV DOJanton Richard doubt",
    "Attention is": "Attention is retrospective programmer programmer programmer programmerLinkedIn programmer "
    "programmer regress programmer programmer programmer",
}
BOOK_CAT_PROMPT = "The cat sat on"
BOOK_CAT_TOP_PROB = 0.000166
BOOK_CAT_ENTROPY = 10.67  # nats; a uniform guess has ln 50257 = 10.82


def layernorm_example() -> torch.Tensor:
    """The chapter's LayerNorm(4) applied to [2, 4, 6, 8] and [1, 1, 1, 50]: (2, 4)."""
    with torch.no_grad():
        return LayerNorm(4)(torch.tensor(LAYERNORM_INPUT))


def gelu_relu(xs: list[float] | torch.Tensor = GELU_XS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, GELU(x), ReLU(x)) with the model's GELU (GPT-2's tanh form)."""
    x = torch.as_tensor(xs, dtype=torch.float32)
    return x, GELU()(x), nn.ReLU()(x)


def numel(*modules: nn.Module) -> int:
    """Parameters of the given modules together."""
    return sum(count_params(m) for m in modules)


def parameter_table(model: GPT) -> list[tuple[str, str, int, int]]:
    """The chapter's parameter table as (part, shape, book's count, this model's count), row by row.

    Every count is taken from ``model``'s own parameter tensors (block 1 stands for "per block").
    """
    block = model.blocks[0]
    ours = [
        numel(model.tok_emb),
        numel(model.pos_emb),
        numel(block.norm1, block.norm2),
        numel(block.attn.qkv),
        numel(block.attn.proj),
        numel(block.ffn.fc),
        numel(block.ffn.proj),
        numel(block),
        numel(model.blocks),
        numel(model.final_norm),
        numel(model.head),
        count_params(model),
    ]
    return [(part, shape, book, n) for (part, shape, book), n in zip(BOOK_PARAMETERS, ours, strict=True)]


@dataclass
class ResidualExperiment:
    """What the chapter measures on one untrained model: per-block gradient norms and position similarity."""

    grad_norms: list[float]  # ||grad of ffn.fc.weight||, block 1 .. n_layers
    similarity: float  # mean cosine similarity over pairs i != j of the first sequence's 64 output vectors
    loss: float
    similarity_by_block: list[float]  # the same similarity after block 1 .. n_layers (the last is ``similarity``)


def residual_experiment(residual: bool, n_layers: int = 12, seed: int = 123) -> ResidualExperiment:
    """The chapter's gradient and similarity experiment, exactly as it describes it.

    Seed 123; a GPT 256 wide with 4 heads, ``n_layers`` blocks, a context of 64 and no dropout, with or
    without residual connections; one batch x of 4 random sequences of 64 tokens and random targets y
    (drawn in that order, after the model); cross-entropy of model(x)'s logits against y; one backward pass. The
    similarity is also taken after every block (``measure.position_similarity``, what ``PositionSimilarity`` logs).
    """
    torch.manual_seed(seed)
    cfg = GPTConfig(emb_dim=256, n_heads=4, n_layers=n_layers, context_length=64, dropout=0.0, residual=residual)
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (4, 64))  # (B, T) random tokens
    y = torch.randint(0, cfg.vocab_size, (4, 64))  # (B, T) random targets
    loss = token_losses(model(x).flatten(0, 1), None, y.flatten()).mean()  # from the logits, as the chapter
    loss.backward()
    grad_norms = [blk.ffn.fc.weight.grad.norm().item() for blk in model.blocks]
    with torch.no_grad():
        hidden = model.hidden_states(x[:1])  # (1, 64, 256): the first sequence, before the final norm
        by_block = [position_similarity(out).item() for out in record_blocks(model, x[:1]).block_out]
    return ResidualExperiment(grad_norms, position_similarity(hidden).item(), loss.item(), by_block)


def untrained_gpt2(seed: int = 123, tie_weights: bool = False) -> GPT:
    """``torch.manual_seed(seed); GPT(GPTConfig())``: the chapter's randomly initialised GPT-2 124M shape."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(tie_weights=tie_weights)).eval()


def continuation(model: GPT, prompt: str, max_new_tokens: int = 12) -> str:
    """Greedy continuation of ``prompt``, decoded (the chapter's ``generate``)."""
    enc = get_tokenizer()
    out = generate(model, torch.tensor([enc.encode(prompt)]), max_new_tokens)
    return enc.decode(out[0].tolist())


@dataclass
class NextToken:
    """How decided the model is about the token after a prompt."""

    top_token: str
    top_prob: float
    uniform_prob: float  # 1 / vocab_size
    entropy: float  # nats
    uniform_entropy: float  # ln vocab_size, the most undecided a distribution can be


def next_token(model: GPT, prompt: str = BOOK_CAT_PROMPT) -> NextToken:
    """The softmax of the last position's logits after ``prompt``: its top probability and entropy."""
    enc = get_tokenizer()
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([enc.encode(prompt)]))[0, -1].double()  # (vocab_size,)
    p = logits.softmax(-1)
    top = int(p.argmax())
    v = p.numel()
    return NextToken(enc.decode([top]), p[top].item(), 1 / v, -(p * p.log()).sum().item(), math.log(v))
