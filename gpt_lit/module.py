"""Training logic: the chapter's GPT as a LightningModule (loss, optimizer, epoch losses, generation)."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from gpt_lit.model import GPT, GPTConfig, generate
from gpt_lit.tokenizer import get_tokenizer


class GPTLightning(L.LightningModule):
    def __init__(
        self,
        config: GPTConfig = GPTConfig(),  # noqa: B008 (a dataclass default: jsonargparse exposes its fields)
        lr: float = 4e-4,
        weight_decay: float = 0.1,
        compile: bool = False,
        max_new_tokens: int = 50,
        temperature: float = 0.0,
        top_k: int | None = None,
    ):
        """The chapter's GPT trained for next-token prediction with cross-entropy and AdamW.

        Args:
            config: The model's sizes (GPTConfig). context_length and vocab_size come from the data
                module (linked), so they always agree with the data.
            lr: AdamW learning rate.
            weight_decay: AdamW weight decay, on every parameter.
            compile: Run the model through ``torch.compile`` (slower start, faster steps).
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
            self.model.compile()
        # Token-weighted means over a whole evaluation set, reduced across processes under DDP.
        self.val_loss, self.train_eval_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch  # (B, T) inputs, (B, T) targets
        logits = self.model(x)  # (B, T, vocab_size)
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
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
