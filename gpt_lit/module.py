"""Training logic: the chapter's GPT as a LightningModule (loss, optimizer, epoch losses, generation)."""

import ctypes
import sys
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MeanMetric

from gpt_lit.distributed import shards_parameters
from gpt_lit.errors import GptLitError
from gpt_lit.hub.pretrained import fetch, load_pretrained
from gpt_lit.inspect_page import write_page
from gpt_lit.loss import token_losses
from gpt_lit.model import GPT, GPTConfig, generate
from gpt_lit.tokenizer import get_tokenizer


def keep_freed_memory() -> bool:
    """Keep freed memory in the process (glibc's malloc): without it, every allocation above 32 MB is a fresh ``mmap``,
    unmapped when freed, so each step page-faults and zero-fills its logits again. False where it does not apply."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


class MeanPerplexity(MeanMetric):
    """exp of the weighted mean of the values given (token losses): the perplexity, reduced across processes."""

    def compute(self) -> torch.Tensor:
        return super().compute().exp()


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
        init_from: str | None = None,
        weights_from_checkpoint: bool = False,
        inspect: bool = False,
    ):
        """The chapter's GPT trained for next-token prediction with cross-entropy and AdamW.

        Args:
            config: The model's sizes; context_length and vocab_size are linked from the data.
            lr: AdamW learning rate.
            weight_decay: AdamW weight decay, on every parameter.
            compile: Run the model through ``torch.compile`` (slower start, faster steps; the loss then comes from
                its logits, not fused_loss). Compiled code draws its dropout masks its own way: other training steps
                with dropout above 0; with dropout 0 the same.
            fused_loss: Compute the output head and the loss together (``gpt_lit.loss.token_losses``): the same losses,
                fewer passes over the logits in training, evaluation in tiles of 1024 tokens x 2048 words of logits.
                Not used under fp16 precision or a strategy that shards the parameters (FSDP).
            fused_adamw: PyTorch's fused AdamW kernel (CPU and CUDA), the same update in one pass; the unfused one
                under 16-mixed, and under bf16-mixed with gradient clipping (said in the log).
            keep_cpu_memory: On CPU (Linux, glibc), keep freed memory in the process for the next step (removes most
                system time; the process stays at its peak memory).
            tf32: On CUDA only, run fp32 matmuls as TF32 (``torch.set_float32_matmul_precision("high")``).
            max_new_tokens: Tokens ``predict`` appends to each prompt.
            temperature: 0 is greedy decoding, the chapter's; above 0 samples from softmax(logits / T), each prompt
                with a generator seeded from the run's seed and its number.
            top_k: When sampling, keep only the k most likely tokens (None: all).
            init_from: Start from GPT-2's released weights: a hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl;
                downloaded once into Hugging Face's cache; needs ``pip install -e ".[hub]"``) or a Hugging Face GPT-2
                folder, whose config.json model.config must match (data.context_length may be shorter). A --ckpt_path
                is restored over these weights.
            weights_from_checkpoint: Set by the CLI with --ckpt_path: a checkpoint gives every weight, so
                ``init_from``'s are not loaded. Not a hyperparameter.
            inspect: ``predict`` only: also write for each prompt a page of what the model does with it,
                ``inspect_<n>.html`` in predict's folder, and its figures, ``inspect_<n>/*.png``. Not a hyperparameter.
        """
        super().__init__()
        if lr <= 0 or weight_decay < 0 or max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k <= 0):
            raise GptLitError("model.lr must be > 0; weight_decay, max_new_tokens, temperature >= 0; top_k > 0 or null")
        self.save_hyperparameters(ignore=["weights_from_checkpoint", "inspect"])
        self.model = GPT(config)
        self.pretrained_loaded = False  # init_from's weights are copied in once, by setup()
        self.weights_from_checkpoint = weights_from_checkpoint
        self.inspect, self.saved_at = inspect, (None, None)  # saved_at: the checkpoint's (step, epoch), for the page
        if compile:
            self.model.compile()  # in place: the state_dict keys stay model.*
        # Token-weighted means over a whole evaluation set, reduced across processes under DDP.
        self.val_loss, self.train_eval_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
        self.test_perplexity = MeanPerplexity()
        # The latest validation's "loss/val" and "loss/train" as floats, for the diagnostics; None after a sanity check.
        self.last_validation: dict[str, Any] | None = None

    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device.type
        if self.hparams.keep_cpu_memory and device == "cpu":
            keep_freed_memory()
        if self.hparams.tf32 and device == "cuda":
            torch.set_float32_matmul_precision("high")
        # Lightning restores a --ckpt_path after setup: a resumed fine-tune continues from it, not the released weights.
        if self.hparams.init_from and not (self.pretrained_loaded or self.weights_from_checkpoint):
            folder = load_pretrained(self.model, self.hparams.init_from)
            self.pretrained_loaded = True
            rank_zero_info(f"model.init_from: GPT-2 weights loaded from {folder}")

    def prepare_data(self) -> None:
        if self.hparams.init_from and not self.weights_from_checkpoint:  # a hub name: downloaded here, once per node
            fetch(self.hparams.init_from)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.saved_at = checkpoint.get("global_step"), checkpoint.get("epoch")
        # Outside fit the CLI removes fit's checkpoint callbacks, whose states the file keeps: left out of the loaded
        # copy, so that Lightning does not warn that they "need to be provided" (the file is unchanged).
        try:
            trainer = self.trainer
        except RuntimeError:  # GPTLightning.load_from_checkpoint: no Trainer, and no callbacks are restored
            return
        if trainer.state.fn != TrainerFn.FITTING and checkpoint.get("callbacks"):
            present = {callback.state_key for callback in trainer.callbacks}
            checkpoint["callbacks"] = {k: v for k, v in checkpoint["callbacks"].items() if k in present}
        # A resume trains with the configured lr and weight decay (config.yaml's), not the optimizer state's, which
        # Lightning restores after this hook (unless a scheduler owns the lr).
        if trainer.state.fn == TrainerFn.FITTING and not checkpoint.get("lr_schedulers"):
            changed = set()
            for state in checkpoint.get("optimizer_states", []):
                for group in state.get("param_groups", []):
                    for key in ("lr", "weight_decay"):
                        if key in group and group[key] != self.hparams[key]:
                            changed.add(f"model.{key} {self.hparams[key]} (the checkpoint's {group[key]})")
                            group[key] = self.hparams[key]
            if changed:
                rank_zero_info(f"resuming with the configured {', '.join(sorted(changed))}")

    def uses_fused_loss(self) -> bool:
        """Whether ``token_losses`` runs the head and the loss together (``fused_loss``, where it is exact and safe)."""
        if not self.hparams.fused_loss or self.hparams.compile:
            return False
        try:
            trainer = self.trainer
        except RuntimeError:  # not attached to a Trainer (the module on its own): one process, full precision
            return True
        # It reads head.weight outside forward (a shard under FSDP); under fp16 its small probabilities would underflow.
        return not shards_parameters(trainer) and not str(trainer.precision).startswith("16")

    def token_losses(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Each token's loss, (B, T), for a batch of (B, T) inputs and (B, T) targets."""
        x, y = batch
        if self.uses_fused_loss():  # the head and the loss together, from what the head reads
            h, weight = self.model.final_norm(self.model.hidden_states(x)), self.model.head.weight
        else:  # the head inside the model's forward: its whole (B, T, vocab_size) logits
            h, weight = self.model(x), None
        return token_losses(h.flatten(0, 1), weight, y.flatten()).view_as(y)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self.token_losses(batch).mean()
        self.log("loss/train_step", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor] | None:
        """Dataloader 0, the validation set, returns each token's loss (B, T) for PositionLoss; 1: the training set."""
        per_token = self.token_losses(batch)
        (self.val_loss if dataloader_idx == 0 else self.train_eval_loss).update(per_token.mean(), per_token.numel())
        return {"token_losses": per_token} if dataloader_idx == 0 else None

    def on_validation_epoch_end(self) -> None:
        # The metric objects: Lightning logs their means across processes and resets them after the loop.
        results: dict[str, Any] = {}
        for name, metric in (("loss/val", self.val_loss), ("loss/train", self.train_eval_loss)):
            if metric.update_count:
                self.log(name, metric, prog_bar=True)
                results[name] = metric.compute().item()
        self.last_validation = None if self.trainer.sanity_checking else results

    def test_step(self, batch, batch_idx: int) -> None:
        loss, tokens = self.token_losses(batch).mean(), batch[1].numel()
        self.test_loss.update(loss, tokens)
        self.test_perplexity.update(loss, tokens)

    def on_test_epoch_end(self) -> None:
        # The metric objects: Lightning computes them across processes, and resets them.
        self.log_dict({"test/loss": self.test_loss, "test/perplexity": self.test_perplexity})

    def on_predict_start(self) -> None:
        # Process 0's seed (set by seed_everything), the same in every process.
        self.predict_seed = self.trainer.strategy.broadcast(torch.initial_seed(), src=0)

    def prompt_generator(self, index: int) -> torch.Generator:
        """The generator prompt ``index`` samples with: seeded from the run's seed and the index alone."""
        seed = int(np.random.SeedSequence([self.predict_seed, index]).generate_state(1, np.uint64)[0])
        return torch.Generator(device=self.device).manual_seed(seed)

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> list[dict]:
        """Continue each prompt: a dict per prompt, its ``index``, ``prompt`` and ``new`` token IDs and ``text``."""
        indices, prompts = batch  # (B,) prompt numbers, (B, T) token IDs
        enc, h = get_tokenizer(), self.hparams
        out = []
        for index, ids in zip(indices.tolist(), prompts, strict=True):
            generator = self.prompt_generator(index) if h.temperature > 0 else None
            row = generate(self.model, ids[None], h.max_new_tokens, h.temperature, h.top_k, generator)[0].tolist()
            prompt, new = row[: len(ids)], row[len(ids) :]
            out.append({"index": index, "prompt": prompt, "new": new, "text": enc.decode(row)})
            if self.inspect:
                folder = Path(self.trainer.log_dir or self.trainer.default_root_dir)
                page = write_page(folder, index + 1, self.model, ids, self.trainer.ckpt_path, self.saved_at)
                print(f"[prompt {index + 1}: its page written to {page}]")
        return out

    def configure_optimizers(self) -> torch.optim.Optimizer:
        fused = self.hparams.fused_adamw and self.device.type in ("cpu", "cuda")
        plugin, clip = self.trainer.precision_plugin, self.trainer.gradient_clip_val
        if fused and isinstance(plugin, MixedPrecision) and (plugin.scaler is not None or clip):
            # Lightning unscales (16-mixed) and clips only before a step that does not unscale by itself.
            why = "to unscale the gradients before the diagnostics and the step" if plugin.scaler else "to clip them"
            rank_zero_info(
                f"model.fused_adamw: using the unfused AdamW under {self.trainer.precision}"
                f"{' with gradient clipping' if clip else ''}: Lightning needs it {why}"
            )
            fused = False
        return torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay, fused=fused
        )
