"""What the model writes as it learns: greedy continuations of fixed prompts in TensorBoard's Text tab."""

import lightning as L
import torch

from gpt_lit.diagnostics.probe import ValidationStep, tensorboards
from gpt_lit.distributed import shards_parameters
from gpt_lit.errors import GptLitError
from gpt_lit.model import generate
from gpt_lit.tokenizer import encode, get_tokenizer


class Samples(ValidationStep):
    def __init__(self, prompts: list[str] | None = None, max_new_tokens: int = 30):
        """Texts ``samples/<prompt>``: each prompt's greedy continuation (the chapter's ``generate``: no random numbers
        drawn); not under strategies that shard the parameters.

        Args:
            prompts: Texts to continue; default "The Time Traveller" and "I saw".
            max_new_tokens: Tokens generated after each prompt.
        """
        self.prompts = list(prompts) if prompts is not None else ["The Time Traveller", "I saw"]
        for n, prompt in enumerate(self.prompts, 1):
            if not prompt.strip():
                raise GptLitError(f"Samples: prompt {n} is empty: give every prompt some text to continue")
        if max_new_tokens < 1:
            raise GptLitError(f"Samples.max_new_tokens must be at least 1, got {max_new_tokens}")
        self.max_new_tokens = max_new_tokens
        self.active = True

    @torch.no_grad()
    def continuations(self, pl_module: L.LightningModule) -> list[str]:
        """Each prompt with its greedy continuation, decoded; the model's training mode left as it was."""
        model, was_training = pl_module.model, pl_module.model.training
        rows = [  # the chapter's greedy loop, each prompt alone (tokenized as data.prompts are)
            generate(model, torch.tensor([encode(prompt)], device=pl_module.device), self.max_new_tokens)[0]
            for prompt in self.prompts
        ]
        model.train(was_training)  # generate() switches the model to eval mode and leaves it there
        return [get_tokenizer().decode(row.tolist()) for row in rows]

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        writers = tensorboards(trainer)
        if not writers or not self.active:
            return
        for prompt, text in zip(self.prompts, self.continuations(pl_module), strict=True):
            entry = f"**{prompt}** →\n\n    {text.replace(chr(10), '↵')}"  # one code line: an early model writes only ↵
            for writer in writers:
                writer.add_text(f"samples/{prompt}", entry, step)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.active = not shards_parameters(trainer, "Samples")
        if trainer.ckpt_path is None:  # a resumed run logged its start already
            self._log(trainer, pl_module, 0)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.fitting(trainer):
            self._log(trainer, pl_module, self.step)
