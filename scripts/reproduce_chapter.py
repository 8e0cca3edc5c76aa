"""Print every table of chapter 4 from live code, the book's value beside ours, and draw its GELU figure.

    python scripts/reproduce_chapter.py                 # figure in lightning_logs/chapter/
    python scripts/reproduce_chapter.py --out figures

The experiments are the functions below, beside the book's numbers (tests/test_chapter_experiments.py checks the
same functions). Training losses come from real runs instead: scripts/run_chapter.sh, then scripts/compare_runs.py.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from gpt_lit.loss import token_losses  # noqa: E402
from gpt_lit.measure import position_similarity, record_blocks  # noqa: E402
from gpt_lit.model import GELU, GPT, GPTConfig, LayerNorm, count_params, generate  # noqa: E402
from gpt_lit.tokenizer import get_tokenizer  # noqa: E402

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
    """The chapter's parameter table as (part, shape, book's count, ``model``'s own count; block 1 is "per block")."""
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
    """The chapter's gradient and similarity experiment as it describes it: seed 123, a GPT 256 wide, 4 heads, a context
    of 64, no dropout; random x and y of 4 x 64 tokens drawn after the model; one backward of cross-entropy."""
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


def section(title: str) -> None:
    print(f"\n=== {title}")


def numbers(values: Sequence[float], fmt: str) -> str:
    return " ".join(format(v, fmt) for v in values)


def layernorm() -> None:
    section("Layer norm, on four numbers: LayerNorm(4) of [2, 4, 6, 8] and [1, 1, 1, 50]")
    ours = layernorm_example().tolist()
    print(f"{'':<7}{'book':<36}| ours")
    for i, (book, mine) in enumerate(zip(BOOK_LAYERNORM, ours, strict=True), 1):
        print(f"row {i}  {numbers(book, '8.4f'):<36}| {numbers(mine, '8.4f')}")


def gelu(out: Path) -> Path:
    section("GELU, a softer ReLU: GELU (tanh form) and ReLU")
    x, g, r = gelu_relu()
    print(f"{'x':>6} | {'ReLU book':>9} {'ours':>7} | {'GELU book':>9} {'ours':>7}")
    for xi, rb, ri, gb, gi in zip(x.tolist(), BOOK_RELU, r.tolist(), BOOK_GELU, g.tolist(), strict=True):
        print(f"{xi:>6.1f} | {rb:>9.4f} {ri:>7.4f} | {gb:>9.4f} {gi:>7.4f}")
    x, g, r = gelu_relu(torch.linspace(-3, 3, 61))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(x, g, "-", label="GELU")
    ax.plot(x, r, "--", label="ReLU")
    ax.set_xlabel("input")
    ax.set_ylabel("output")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "gelu_relu.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"[figure: GELU (solid) and ReLU (dashed) at 61 points from -3 to 3 -> {path}]")
    return path


def parameters(model: GPT) -> None:
    section("Counting the parameters of GPT(GPTConfig()), from the module's own tensors")
    print(f"{'Part':<41}{'Shape':<22}{'book':>13} | {'ours':>13}")
    for part, shape, book, ours in parameter_table(model):
        print(f"{part:<41}{shape:<22}{book:>13,} | {ours:>13,}")
    with torch.device("meta"):  # shapes only: the tied model needs no memory to count
        tied = count_params(GPT(GPTConfig(tie_weights=True)))
    untied = count_params(model)
    print(f"{'count_params, untied':<63}{BOOK_TOTAL_UNTIED:>13,} | {untied:>13,}")
    print(f"{'count_params, tie_weights=True':<63}{BOOK_TOTAL_TIED:>13,} | {tied:>13,}")
    print(f"{'bytes at 4 per float32, tied':<63}{BOOK_BYTES_TIED:>13,} | {4 * tied:>13,}")
    print(f"{'MB at 4 per float32, untied':<63}{652:>13,} | {4 * untied / 1e6:>13,.0f}")


def residuals() -> None:
    section(
        "Residual connections: seed 123, GPT 256 wide, 4 heads, context 64, no dropout; x, y = 4 x 64 random "
        "tokens; one backward of cross-entropy(model(x), y)"
    )
    runs = {(n, res): residual_experiment(res, n) for n in (12, 48) for res in (True, False)}
    print("Gradient norm of each block's ffn.fc.weight (12 blocks)")
    print(f"{'Block':<22}" + " ".join(f"{i:>4}" for i in range(1, 13)))
    for res, name in ((True, "With residuals"), (False, "Without")):
        print(f"{name + ', book':<22}{numbers(BOOK_GRAD_NORMS[res], '4.2f')}")
        print(f"{name + ', ours':<22}{numbers(runs[12, res].grad_norms, '4.2f')}")
    print("\nMean cosine similarity between the 64 positions of the first sequence, after the last block")
    print(f"{'Blocks':<8}{'with residuals: book':>21} | {'ours':<6}{'without: book':>15} | ours")
    for n in (12, 48):
        with_, without = runs[n, True].similarity, runs[n, False].similarity
        print(
            f"{n:<8}{BOOK_SIMILARITY[n, True]:>21.3f} | {with_:<6.3f}{BOOK_SIMILARITY[n, False]:>15.3f} | "
            f"{without:.3f}"
        )
    similarity_by_block(runs[12, True], runs[12, False])


def similarity_by_block(with_: ResidualExperiment, without: ResidualExperiment) -> None:
    """The similarity after every block of the 12-block models: how it grows with depth without residuals."""
    n = len(with_.similarity_by_block)
    print(f"\nThe same similarity after each block ({n} blocks; the last column is the table's)")
    print(f"{'Block':<16}" + " ".join(f"{i:>5}" for i in range(1, n + 1)))
    print(f"{'With residuals':<16}{numbers(with_.similarity_by_block, '5.3f')}")
    print(f"{'Without':<16}{numbers(without.similarity_by_block, '5.3f')}")


def untrained(model: GPT) -> None:
    section("Asking an untrained model to write: seed 123, GPT(GPTConfig()), greedy, 12 new tokens")
    for prompt, book in BOOK_CONTINUATIONS.items():
        ours = continuation(model, prompt, 12)
        print(f"book: {book}\nours: {ours}\n")
    nt = next_token(model, BOOK_CAT_PROMPT)
    print(f"{'Next token after ' + repr(BOOK_CAT_PROMPT):<54}{'book':>9} | ours")
    top = f"probability of the most likely token ({nt.top_token!r})"
    print(f"{top:<54}{BOOK_CAT_TOP_PROB:>9.6f} | {nt.top_prob:.6f}")
    print(f"{'probability of each token, uniform (1/50257)':<54}{0.0000199:>9.7f} | {nt.uniform_prob:.7f}")
    print(f"{'entropy of the distribution, nats':<54}{BOOK_CAT_ENTROPY:>9.2f} | {nt.entropy:.2f}")
    print(f"{'entropy of a uniform guess, ln 50257':<54}{10.82:>9.2f} | {nt.uniform_entropy:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("lightning_logs/chapter"), help="folder for the figure")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    layernorm()
    gelu(args.out)
    residuals()
    model = untrained_gpt2(seed=123)  # built once: the parameter table counts it, then it writes
    parameters(model)
    untrained(model)
    print(f"\n[done in {time.time() - start:.0f} s]")


if __name__ == "__main__":
    main()
