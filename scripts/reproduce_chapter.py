"""Print every table of chapter 4 from live code, the book's value beside ours, and draw its GELU figure.

    python scripts/reproduce_chapter.py                 # figure in lightning_logs/chapter/
    python scripts/reproduce_chapter.py --out figures

The experiments live in gpt_lit/experiments.py (the tests check the same functions); this file only prints.
Training losses come from real runs instead: scripts/run_chapter.sh, then scripts/compare_runs.py.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from gpt_lit import experiments as ex  # noqa: E402
from gpt_lit.model import GPT, GPTConfig, count_params  # noqa: E402


def section(title: str) -> None:
    print(f"\n=== {title}")


def numbers(values: Sequence[float], fmt: str) -> str:
    return " ".join(format(v, fmt) for v in values)


def layernorm() -> None:
    section("Layer norm, on four numbers: LayerNorm(4) of [2, 4, 6, 8] and [1, 1, 1, 50]")
    ours = ex.layernorm_example().tolist()
    print(f"{'':<7}{'book':<36}| ours")
    for i, (book, mine) in enumerate(zip(ex.BOOK_LAYERNORM, ours, strict=True), 1):
        print(f"row {i}  {numbers(book, '8.4f'):<36}| {numbers(mine, '8.4f')}")


def gelu(out: Path) -> Path:
    section("GELU, a softer ReLU: GELU (tanh form) and ReLU")
    x, g, r = ex.gelu_relu()
    print(f"{'x':>6} | {'ReLU book':>9} {'ours':>7} | {'GELU book':>9} {'ours':>7}")
    for xi, rb, ri, gb, gi in zip(x.tolist(), ex.BOOK_RELU, r.tolist(), ex.BOOK_GELU, g.tolist(), strict=True):
        print(f"{xi:>6.1f} | {rb:>9.4f} {ri:>7.4f} | {gb:>9.4f} {gi:>7.4f}")
    x, g, r = ex.gelu_relu(torch.linspace(-3, 3, 61))
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
    for part, shape, book, ours in ex.parameter_table(model):
        print(f"{part:<41}{shape:<22}{book:>13,} | {ours:>13,}")
    with torch.device("meta"):  # shapes only: the tied model needs no memory to count
        tied = count_params(GPT(GPTConfig(tie_weights=True)))
    untied = count_params(model)
    print(f"{'count_params, untied':<63}{ex.BOOK_TOTAL_UNTIED:>13,} | {untied:>13,}")
    print(f"{'count_params, tie_weights=True':<63}{ex.BOOK_TOTAL_TIED:>13,} | {tied:>13,}")
    print(f"{'bytes at 4 per float32, tied':<63}{ex.BOOK_BYTES_TIED:>13,} | {4 * tied:>13,}")
    print(f"{'MB at 4 per float32, untied':<63}{652:>13,} | {4 * untied / 1e6:>13,.0f}")


def residuals() -> None:
    section(
        "Residual connections: seed 123, GPT 256 wide, 4 heads, context 64, no dropout; x, y = 4 x 64 random "
        "tokens; one backward of cross-entropy(model(x), y)"
    )
    runs = {(n, res): ex.residual_experiment(res, n) for n in (12, 48) for res in (True, False)}
    print("Gradient norm of each block's ffn.fc.weight (12 blocks)")
    print(f"{'Block':<22}" + " ".join(f"{i:>4}" for i in range(1, 13)))
    for res, name in ((True, "With residuals"), (False, "Without")):
        print(f"{name + ', book':<22}{numbers(ex.BOOK_GRAD_NORMS[res], '4.2f')}")
        print(f"{name + ', ours':<22}{numbers(runs[12, res].grad_norms, '4.2f')}")
    print("\nMean cosine similarity between the 64 positions of the first sequence, after the last block")
    print(f"{'Blocks':<8}{'with residuals: book':>21} | {'ours':<6}{'without: book':>15} | ours")
    for n in (12, 48):
        with_, without = runs[n, True].similarity, runs[n, False].similarity
        print(
            f"{n:<8}{ex.BOOK_SIMILARITY[n, True]:>21.3f} | {with_:<6.3f}{ex.BOOK_SIMILARITY[n, False]:>15.3f} | "
            f"{without:.3f}"
        )
    similarity_by_block(runs[12, True], runs[12, False])


def similarity_by_block(with_: ex.ResidualExperiment, without: ex.ResidualExperiment) -> None:
    """The similarity after every block of the 12-block models: how it grows with depth without residuals."""
    n = len(with_.similarity_by_block)
    print(f"\nThe same similarity after each block ({n} blocks; the last column is the table's)")
    print(f"{'Block':<16}" + " ".join(f"{i:>5}" for i in range(1, n + 1)))
    print(f"{'With residuals':<16}{numbers(with_.similarity_by_block, '5.3f')}")
    print(f"{'Without':<16}{numbers(without.similarity_by_block, '5.3f')}")


def untrained(model: GPT) -> None:
    section("Asking an untrained model to write: seed 123, GPT(GPTConfig()), greedy, 12 new tokens")
    for prompt, book in ex.BOOK_CONTINUATIONS.items():
        ours = ex.continuation(model, prompt, 12)
        print(f"book: {book}\nours: {ours}\n")
    nt = ex.next_token(model, ex.BOOK_CAT_PROMPT)
    print(f"{'Next token after ' + repr(ex.BOOK_CAT_PROMPT):<54}{'book':>9} | ours")
    top = f"probability of the most likely token ({nt.top_token!r})"
    print(f"{top:<54}{ex.BOOK_CAT_TOP_PROB:>9.6f} | {nt.top_prob:.6f}")
    print(f"{'probability of each token, uniform (1/50257)':<54}{0.0000199:>9.7f} | {nt.uniform_prob:.7f}")
    print(f"{'entropy of the distribution, nats':<54}{ex.BOOK_CAT_ENTROPY:>9.2f} | {nt.entropy:.2f}")
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
    model = ex.untrained_gpt2(seed=123)  # built once: the parameter table counts it, then it writes
    parameters(model)
    untrained(model)
    print(f"\n[done in {time.time() - start:.0f} s]")


if __name__ == "__main__":
    main()
