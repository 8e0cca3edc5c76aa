"""Training and evaluation speed of gpt_lit, against a bare PyTorch loop, Hugging Face's GPT-2 and the matmul peak.

In one process, for the chapter's shape (4 blocks, 256 wide, 4 heads, context 128, batch 16, vocabulary 50257)
and GPT-2 124M's shape at a short context, it measures training and evaluation tokens per second of
  (a) gpt_lit's GPTLightning through the Lightning Trainer (``fit``/``validate``; no logger, no checkpoints,
      no progress bar),
  (b) the same GPT (same weights), loss and optimizer in a bare PyTorch loop,
  (c) ``transformers.GPT2LMHeadModel`` built from a GPT2Config of the same shape (random init, nothing
      downloaded, SDPA attention, ``F.cross_entropy`` on its logits, the same AdamW),
  (d) the chapter's loop written plainly: logits, ``F.cross_entropy``, PyTorch's default AdamW (what a reader
      would write; chapter shape only),
and the machine's peak matmul rate (a large ``torch.mm``). The contenders are interleaved step by step: a
callback runs one step of (b), (c), (d) and the matmul, in rotating order, after every Lightning step, so
background load hits all alike, and each figure is the fastest of the steps after the first (warm-up): other
load only ever slows a step, so the fastest is the least disturbed. Lightning's step
is timed from the end of the previous contender's step to the end of its batch: its loop, data fetching and
hooks all count.
It prints one figure a line, ``name: value``.

Model FLOPs utilisation = training FLOPs per token x tokens/s / measured matmul peak, with
    training FLOPs per token = 6 N + 12 n_layers T emb_dim
where the second term is the attention scores and weighted sums (2 x 2 T emb_dim per token and layer
forward, x3 with backward; all T positions counted, as in the PaLM paper), in two counts of N:
  ``mfu``              N = every parameter of the model (``count_params``, the chapter's count: 28.9 M for
                       the chapter's shape), the usual 6 N;
  ``mfu_matmul_only``  N = the weights that do matmuls, n_layers 12 emb_dim^2 + vocab_size emb_dim (16.0 M):
                       the FLOPs the step really does (``torch.utils.flop_counter`` agrees). The token
                       embedding table (12.9 M of the 28.9 M) is a lookup, so ``mfu`` counts 1.8x the real work
                       and can exceed 1; ``mfu_matmul_only`` is the fraction of the peak really used.
Evaluation: 2 N + 4 n_layers T emb_dim per token. The peak is (n x n) @ (n x n) fp32 products (bf16 with
--precision bf16-mixed).

    python scripts/bench.py --quick                          # fewer steps (docs/performance.md: how long)
    python scripts/bench.py --quick --precision bf16-mixed   # every contender in bf16-mixed
    python scripts/bench.py                                  # more steps
    python scripts/bench.py --smoke                          # a tiny shape, seconds: checks the plumbing
"""

from __future__ import annotations

import argparse
import logging
import resource
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from gpt_lit.flops import eval_flops_per_token, matmul_params, matmul_step, train_flops_per_token  # noqa: F401
from gpt_lit.loss import token_losses
from gpt_lit.model import GPT, GPTConfig, count_params
from gpt_lit.module import GPTLightning, keep_freed_memory

PRECISIONS = ("32-true", "bf16-mixed")


@dataclass
class Shape:
    """A model shape, the batches it is measured with, and how many steps."""

    name: str
    cfg: GPTConfig
    batch_size: int
    eval_batch_size: int
    steps: int  # timed training steps of each contender (plus one warm-up step)
    eval_steps: int  # timed evaluation batches of each contender (plus one warm-up batch)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_windows(cfg: GPTConfig, n: int, seed: int) -> TensorDataset:
    """``n`` random token windows and their targets (the speed does not depend on the text)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (n, cfg.context_length + 1), generator=g)
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def forever(loader: DataLoader) -> Iterator:
    while True:
        yield from loader


# The losses of the contenders, for the same (x, y) batches.
def gpt_lit_loss(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """GPTLightning.loss with fused_loss (its default), written out."""
    h = model.final_norm(model.hidden_states(x))
    return token_losses(h.flatten(0, 1), model.head.weight, y.flatten()).mean()


def plain_loss(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The chapter's loss written plainly (and GPTLightning.loss when compiled): logits, then cross-entropy."""
    return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())


def hf_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(input_ids=x).logits.flatten(0, 1).float(), y.flatten())


def hf_model(cfg: GPTConfig) -> torch.nn.Module:
    """Hugging Face's GPT-2 with gpt_lit's shape, randomly initialised."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.context_length,
            n_embd=cfg.emb_dim,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            activation_function="gelu_new",  # GPT-2's tanh GELU, as gpt_lit's
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.dropout,
            tie_word_embeddings=cfg.tie_weights,
            bos_token_id=cfg.vocab_size - 1,
            eos_token_id=cfg.vocab_size - 1,
            attn_implementation="sdpa",
        )
    )


def adamw(params, hparams, device: torch.device, fused: bool | None = None) -> torch.optim.Optimizer:
    """GPTLightning.configure_optimizers' AdamW (fused kernel when hparams.fused_adamw)."""
    if fused is None:
        fused = hparams.fused_adamw and device.type in ("cpu", "cuda")
    return torch.optim.AdamW(params, lr=hparams.lr, weight_decay=hparams.weight_decay, fused=fused)


def train_step(model, loss_fn, opt, loader: DataLoader, device: torch.device, precision: str) -> Callable[[], None]:
    """One step of a bare training loop per call."""
    batches = forever(loader)

    def step() -> None:
        model.train()
        x, y = (t.to(device) for t in next(batches))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def eval_step(model, loss_fn, loader: DataLoader, device: torch.device, precision: str) -> Callable[[], None]:
    """One batch of a bare evaluation loop per call."""
    batches = forever(loader)

    def step() -> None:
        model.eval()
        x, y = (t.to(device) for t in next(batches))
        with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss_fn(model, x, y).item()

    return step


class Interleaved(Callback):
    """After every Lightning batch, one step of each other contender; the duration of every step."""

    def __init__(self, others: dict[str, Callable[[], None]], device: torch.device):
        self.others, self.device = others, device
        self.times: dict[str, list[float]] = {"lightning": [], **{name: [] for name in others}}
        self.last: float | None = None

    def _now(self) -> float:
        sync(self.device)
        return time.perf_counter()

    def _after_lightning_batch(self) -> None:
        now = self._now()
        if self.last is not None:  # Lightning's first batch is not timed: nothing ran before it
            self.times["lightning"].append(now - self.last)
        names = list(self.others)
        k = len(self.times["lightning"]) % len(names)  # rotate the order, so no contender always follows another
        for name in names[k:] + names[:k]:
            self.others[name]()
            then, now = now, self._now()
            self.times[name].append(now - then)
        self.last = now

    def on_train_batch_end(self, *args) -> None:
        self._after_lightning_batch()

    def on_validation_batch_end(self, *args) -> None:
        self._after_lightning_batch()

    def fastest(self) -> dict[str, float]:
        """Fastest step of each contender, the first (warm-up) step of each left out.

        Other load on the machine only ever slows a step, so the fastest one is the least disturbed (what
        ``timeit`` advises); medians of a few steps move with the load (docs/performance.md).
        """
        return {name: min(ts[1:]) for name, ts in self.times.items()}


def trainer(device: torch.device, precision: str, callback: Callback, batches: int, train: bool) -> L.Trainer:
    limits = {"limit_train_batches": batches, "limit_val_batches": 0} if train else {"limit_val_batches": batches}
    return L.Trainer(
        accelerator=device.type,
        devices=1,
        precision=precision,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[callback],
        **limits,
    )


def run_shape(args: argparse.Namespace, shape: Shape, device: torch.device, out: dict, headline: bool) -> None:
    """Measure one shape; ``headline``: also the other precision and the chapter's loop written plainly."""
    p, cfg, prec = shape.name, shape.cfg, args.precision
    other = PRECISIONS[1 - PRECISIONS.index(prec)]
    torch.manual_seed(123)
    module = GPTLightning(cfg, compile=args.compile, tf32=args.tf32)
    if args.tf32 and device.type == "cuda":  # what GPTLightning.setup does, for the other contenders too
        torch.set_float32_matmul_precision("high")
    bare = GPT(cfg).to(device)
    bare.load_state_dict(module.model.state_dict())
    if args.compile:
        bare.compile()
    bare_loss = plain_loss if args.compile else gpt_lit_loss  # as GPTLightning.loss does
    train_data = random_windows(cfg, (shape.steps + 2) * shape.batch_size, 0)
    eval_data = random_windows(cfg, (shape.eval_steps + 2) * shape.eval_batch_size, 1)

    def loader(data: TensorDataset, train: bool) -> DataLoader:
        return DataLoader(data, shape.batch_size if train else shape.eval_batch_size, shuffle=train)

    others = {
        "bare": train_step(
            bare, bare_loss, adamw(bare.parameters(), module.hparams, device), loader(train_data, True), device, prec
        )
    }
    evals = {"bare": eval_step(bare, bare_loss, loader(eval_data, False), device, prec)}
    if not args.no_hf:
        hf = hf_model(cfg).to(device)
        if args.compile:
            hf.compile()
        hf_opt = adamw(hf.parameters(), module.hparams, device)
        others["hf"] = train_step(hf, hf_loss, hf_opt, loader(train_data, True), device, prec)
        evals["hf"] = eval_step(hf, hf_loss, loader(eval_data, False), device, prec)
    if headline:  # the chapter's loop written plainly: what a reader would write, and what the speed options buy
        plain = GPT(cfg).to(device)
        plain_opt = torch.optim.AdamW(
            plain.parameters(), lr=module.hparams.lr, weight_decay=module.hparams.weight_decay
        )
        others["plain"] = train_step(plain, plain_loss, plain_opt, loader(train_data, True), device, prec)
    peak_dtype = torch.bfloat16 if prec == "bf16-mixed" else torch.float32
    others["peak"], peak_flops = matmul_step(device, peak_dtype, args.peak_n, args.peak_reps)

    # Training: one fit, the others' steps interleaved with Lightning's.
    timed = Interleaved(others, device)
    trainer(device, prec, timed, shape.steps + 2, train=True).fit(module, loader(train_data, True))
    train_s = timed.fastest()
    # Evaluation: one validate, interleaved likewise.
    timed_eval = Interleaved(evals, device)
    trainer(device, prec, timed_eval, shape.eval_steps + 2, train=False).validate(
        module, loader(eval_data, False), verbose=False
    )
    eval_s = timed_eval.fastest()

    T = cfg.context_length
    tokens, eval_tokens = shape.batch_size * T, shape.eval_batch_size * T
    train_tps = {name: tokens / s for name, s in train_s.items() if name != "peak"}
    eval_tps = {name: eval_tokens / s for name, s in eval_s.items()}
    peak = peak_flops / train_s["peak"]
    a = train_tps["lightning"]
    out[f"{p}_train_tokens_per_s"] = a
    out[f"{p}_bare_train_tokens_per_s"] = train_tps["bare"]
    out[f"{p}_lightning_vs_bare"] = a / train_tps["bare"]
    if "hf" in train_tps:
        out[f"{p}_hf_train_tokens_per_s"] = train_tps["hf"]
        out[f"{p}_gpt_lit_vs_hf"] = a / train_tps["hf"]
    if "plain" in train_tps:
        out[f"{p}_plain_train_tokens_per_s"] = train_tps["plain"]
        out[f"{p}_gpt_lit_vs_plain"] = a / train_tps["plain"]
    out[f"{p}_eval_tokens_per_s"] = eval_tps["lightning"]
    out[f"{p}_bare_eval_tokens_per_s"] = eval_tps["bare"]
    out[f"{p}_lightning_vs_bare_eval"] = eval_tps["lightning"] / eval_tps["bare"]
    if "hf" in eval_tps:
        out[f"{p}_hf_eval_tokens_per_s"] = eval_tps["hf"]
        out[f"{p}_gpt_lit_vs_hf_eval"] = eval_tps["lightning"] / eval_tps["hf"]
    out[f"{p}_eval_vs_train"] = eval_tps["lightning"] / a
    n_all = count_params(module.model)
    out[f"{p}_params"] = n_all
    out[f"{p}_matmul_params"] = matmul_params(cfg)
    out[f"{p}_train_flops_per_token"] = train_flops_per_token(cfg, T, n_all)
    out[f"{p}_train_matmul_flops_per_token"] = train_flops_per_token(cfg, T)
    out[f"{p}_peak_{'bf16' if prec == 'bf16-mixed' else 'fp32'}_gflops"] = peak / 1e9
    out[f"{p}_mfu"] = train_flops_per_token(cfg, T, n_all) * a / peak
    out[f"{p}_mfu_matmul_only"] = train_flops_per_token(cfg, T) * a / peak
    if "plain" in train_tps:
        out[f"{p}_plain_mfu"] = train_flops_per_token(cfg, T, n_all) * train_tps["plain"] / peak
        out[f"{p}_plain_mfu_matmul_only"] = train_flops_per_token(cfg, T) * train_tps["plain"] / peak
    out[f"{p}_eval_mfu"] = eval_flops_per_token(cfg, T, n_all) * eval_tps["lightning"] / peak
    out[f"{p}_eval_mfu_matmul_only"] = eval_flops_per_token(cfg, T) * eval_tps["lightning"] / peak

    if headline:  # Lightning in the other precision, interleaved with the bare loop in this one
        other_timed = Interleaved({"bare": others["bare"]}, device)
        trainer(device, other, other_timed, shape.steps + 2, train=True).fit(module, loader(train_data, True))
        s = other_timed.fastest()
        a_other = tokens / s["lightning"]
        out[f"{p}_train_tokens_per_s_{other}"] = a_other
        # Both runs against the same bare loop (in this precision), so load that differs between them cancels.
        other_vs_this = (s["bare"] / s["lightning"]) / (a / train_tps["bare"])
        out[f"{p}_bf16_vs_fp32"] = other_vs_this if prec == "32-true" else 1 / other_vs_this
    if device.type == "cuda":
        out[f"{p}_peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
    else:  # the process's largest resident size so far (Linux reports KiB)
        out[f"{p}_peak_memory_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (docs/performance.md: how long)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, a few seconds (tests the script)")
    parser.add_argument("--precision", choices=PRECISIONS, default="32-true", help="Lightning's precision, for all")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model (slow start)")
    parser.add_argument("--tf32", action="store_true", help="CUDA: TF32 matmuls (GPTLightning's tf32; for all)")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face peer")
    parser.add_argument("--gpt2-context", type=int, default=64, help="context of the GPT-2 124M shape")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # Lightning's hints about workers, validation loops, ...
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # ... and its "GPU available" lines
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # The process-wide malloc setting GPTLightning(keep_cpu_memory=True) makes when it runs on CPU, made up
    # front so that the bare loop and Hugging Face's model have it too.
    kept = keep_freed_memory() if device.type == "cpu" else False

    chapter = GPTConfig(vocab_size=50257, context_length=128, emb_dim=256, n_layers=4, n_heads=4, dropout=0.1)
    gpt2 = GPTConfig(vocab_size=50257, context_length=args.gpt2_context, tie_weights=True)  # 124M, tied head
    if args.smoke:
        tiny = GPTConfig(vocab_size=512, context_length=16, emb_dim=32, n_layers=2, n_heads=2, dropout=0.1)
        shapes = [Shape("chapter", tiny, 4, 8, 2, 2), Shape("gpt2", replace(tiny, tie_weights=True), 2, 4, 2, 2)]
        args.peak_n, args.peak_reps = 256, 2
    elif args.quick:
        shapes = [Shape("chapter", chapter, 16, 64, 5, 3), Shape("gpt2", gpt2, 4, 16, 5, 2)]
        args.peak_n, args.peak_reps = 2048, 4
    else:
        shapes = [Shape("chapter", chapter, 16, 64, 12, 6), Shape("gpt2", gpt2, 4, 16, 8, 4)]
        args.peak_n, args.peak_reps = 2048, 4

    out: dict[str, float | str] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()}",
        "precision": args.precision,
        "compile": str(args.compile),
        "tf32": str(args.tf32 and device.type == "cuda"),
        "keep_cpu_memory": str(kept),
    }
    t0 = time.perf_counter()
    for i, shape in enumerate(shapes):
        run_shape(args, shape, device, out, headline=i == 0)
    # The headline figures: the chapter's shape.
    headline = ("lightning_vs_bare", "gpt_lit_vs_hf", "gpt_lit_vs_plain", "mfu", "mfu_matmul_only", "plain_mfu")
    for name in (*headline, "eval_vs_train", "bf16_vs_fp32"):
        if f"chapter_{name}" in out:
            out[name] = out[f"chapter_{name}"]
    out["peak_memory_mb"] = max(v for k, v in out.items() if k.endswith("_peak_memory_mb"))
    out["bench_seconds"] = time.perf_counter() - t0
    for k, v in out.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    main()
