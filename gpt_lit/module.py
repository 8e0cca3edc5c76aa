"""Training logic: the chapter's GPT as a LightningModule (loss, optimizer, epoch losses, generation)."""

from __future__ import annotations

import ctypes
import sys

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from gpt_lit.model import GPT, GPTConfig, generate
from gpt_lit.tokenizer import get_tokenizer


class _HeadCrossEntropy(torch.autograd.Function):
    """Output head and cross-entropy in one step, for training: mean_i -log softmax(h_i W^T)[t_i].

    The same numbers as ``F.cross_entropy(F.linear(h, W), t)``, with fewer passes over the (tokens x
    vocab_size) logits, the largest tensors of the step (411 MB at 16 x 128 tokens). Its gradient,
    softmax - one_hot(t), is made in the forward pass from one softmax, whose row maxima also give the
    loss: log sum_j exp(x_j) = max_j x_j - log max_j softmax(x)_j (that probability never underflows).
    Autograd instead runs log_softmax, then a zero-fill, a scatter and log_softmax's backward (two exps).
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype):
        h_c, w_c = h.to(dtype), weight.to(dtype)  # the matmul's dtype: bf16 under bf16-mixed, as autocast does
        logits = (h_c @ w_c.T).float()  # (N, V); the softmax and the loss in fp32 always
        top = logits.amax(dim=-1)  # (N,)
        target_logit = logits.gather(1, targets[:, None]).squeeze(1)  # (N,)
        probs = torch.softmax(logits, dim=-1)  # (N, V)
        log_sum_exp = top - probs.amax(dim=-1).log()  # (N,): the top logit's probability is exp(top - lse)
        probs.scatter_add_(1, targets[:, None], probs.new_full((len(targets), 1), -1.0))  # d loss_i / d logits_i
        ctx.save_for_backward(h_c, w_c, probs.to(dtype))
        ctx.in_dtypes = (h.dtype, weight.dtype)
        return (log_sum_exp - target_logit).mean()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        h_c, w_c, grad_logits = ctx.saved_tensors
        scale = grad_loss / len(grad_logits)  # d(mean)/d(each term)
        grad_h = (grad_logits @ w_c).to(ctx.in_dtypes[0]) * scale  # (N, C)
        grad_w = (grad_logits.T @ h_c).to(ctx.in_dtypes[1]) * scale  # (V, C)
        return grad_h, grad_w, None, None


def head_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """``F.cross_entropy(F.linear(h, weight), targets)`` (mean over all N targets), computed faster.

    h: (N, C) final hidden states, weight: (V, C) output head, targets: (N,) token IDs, every one counted
    (there is no ignore_index). With gradients it uses ``_HeadCrossEntropy``; without (evaluation), ``chunk``
    rows at a time, so a batch of 64 x 128 tokens never holds its 1.6 GB of logits at once. Under autocast
    the matmul runs in the autocast dtype (bf16-mixed: bf16) and the softmax in fp32, as ``F.linear``
    followed by ``.float()`` would.
    """
    dtype = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _HeadCrossEntropy.apply(h, weight, targets, dtype)
    w_c, total = weight.to(dtype), h.new_zeros((), dtype=torch.float32)
    for i in range(0, len(h), chunk):
        logits = (h[i : i + chunk].to(dtype) @ w_c.T).float()  # (chunk, V)
        total += F.cross_entropy(logits, targets[i : i + chunk], reduction="sum")
    return total / len(h)


def keep_freed_memory() -> bool:
    """Keep freed memory in the process (glibc's malloc) instead of giving it back to the OS at once.

    By default glibc serves every allocation above 32 MB with a fresh ``mmap`` and unmaps it when freed, so
    each training step page-faults and zero-fills its 411 MB logits again: on this project's 2-core CPU a
    third of a run's CPU time went to the kernel. Serving them from the heap and never trimming it keeps
    those pages mapped (the process's memory stays at its peak). Returns False where it does not apply.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


class GPTLightning(L.LightningModule):
    def __init__(
        self,
        config: GPTConfig = GPTConfig(),  # noqa: B008 (a dataclass default: jsonargparse exposes its fields)
        lr: float = 4e-4,
        weight_decay: float = 0.1,
        compile: bool = False,
        fused_loss: bool = True,
        fused_adamw: bool = True,
        keep_cpu_memory: bool = True,
        tf32: bool = False,
        max_new_tokens: int = 50,
        temperature: float = 0.0,
        top_k: int | None = None,
    ):
        """The chapter's GPT trained for next-token prediction with cross-entropy and AdamW.

        Speed options (none changes the fp32 numbers beyond float rounding, except ``tf32``). Mixed
        precision is the trainer's: ``trainer.precision: bf16-mixed`` runs the matmuls in bf16 and keeps
        the weights, softmax and loss in fp32.

        Args:
            config: The model's sizes (GPTConfig). context_length and vocab_size come from the data
                module (linked), so they always agree with the data.
            lr: AdamW learning rate.
            weight_decay: AdamW weight decay, on every parameter.
            compile: Run the model through ``torch.compile`` (a slower start, then faster steps). The loss
                then goes through the compiled ``model(x)`` and ``F.cross_entropy`` (fused_loss is unused).
            fused_loss: Compute the output head and the cross-entropy together (``head_cross_entropy``):
                fewer passes over the logits when training, and evaluation in chunks of rows, never holding
                a whole batch's logits. Same losses as ``F.cross_entropy(model(x), y)`` to float rounding.
            fused_adamw: PyTorch's fused AdamW kernel (CPU and CUDA): one pass over all the parameters per
                step instead of one per operation; on CPU 21 ms instead of 99 ms a step for the chapter's
                model, the same update.
            keep_cpu_memory: When running on CPU (Linux, glibc), keep freed memory in the process instead of
                returning it to the OS every step (see ``keep_freed_memory``): removes most system time.
                A process-wide setting; the process's memory then stays at its peak.
            tf32: On CUDA only, run fp32 matmuls as TF32 (``torch.set_float32_matmul_precision("high")``):
                several times faster on Ampere and later GPUs, 10-bit mantissa products. Ignored on CPU.
            max_new_tokens: Tokens ``predict`` appends to each prompt.
            temperature: 0 is greedy decoding, the chapter's; above 0 samples from softmax(logits / T).
            top_k: When sampling, keep only the k most likely tokens (None: all).
        """
        super().__init__()
        if lr <= 0 or weight_decay < 0 or max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k <= 0):
            raise ValueError("model.lr must be > 0; weight_decay, max_new_tokens, temperature >= 0; top_k > 0 or null")
        self.save_hyperparameters()
        self.model = GPT(config)
        if compile:
            self.model.compile()  # in place: the state_dict keys stay model.*
        # Token-weighted means over a whole evaluation set, reduced across processes under DDP.
        self.val_loss, self.train_eval_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()

    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device.type
        if self.hparams.keep_cpu_memory and device == "cpu":
            keep_freed_memory()
        if self.hparams.tf32 and device == "cuda":
            torch.set_float32_matmul_precision("high")

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch  # (B, T) inputs, (B, T) targets
        if self.hparams.fused_loss and not self.hparams.compile:
            h = self.model.final_norm(self.model.hidden_states(x))  # (B, T, emb_dim)
            return head_cross_entropy(h.flatten(0, 1), self.model.head.weight, y.flatten())
        logits = self.model(x)  # (B, T, vocab_size); bf16 under bf16-mixed, so the loss is taken in fp32
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("loss/train_step", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        # dataloader 0: the validation set; 1: the whole training set (see TimeMachineData.val_dataloader)
        metric = self.val_loss if dataloader_idx == 0 else self.train_eval_loss
        metric.update(self.loss(batch), batch[1].numel())

    def on_validation_epoch_end(self) -> None:
        self.log("loss/val", self.val_loss.compute(), prog_bar=True)
        self.val_loss.reset()
        if self.train_eval_loss.update_count:
            self.log("loss/train", self.train_eval_loss.compute(), prog_bar=True)
            self.train_eval_loss.reset()

    def test_step(self, batch, batch_idx: int) -> None:
        self.test_loss.update(self.loss(batch), batch[1].numel())

    def on_test_epoch_end(self) -> None:
        loss = self.test_loss.compute()
        self.log_dict({"test/loss": loss, "test/perplexity": loss.exp()})
        self.test_loss.reset()

    def predict_step(self, batch: torch.Tensor, batch_idx: int) -> list[str]:
        out = generate(self.model, batch, self.hparams.max_new_tokens, self.hparams.temperature, self.hparams.top_k)
        enc = get_tokenizer()
        return [enc.decode(row.tolist()) for row in out]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.parameters(),
            lr=self.hparams.lr,
            weight_decay=self.hparams.weight_decay,
            fused=self.hparams.fused_adamw and self.device.type in ("cpu", "cuda"),
        )
