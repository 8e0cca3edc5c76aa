"""``python -m gpt_lit export``: a trained checkpoint as a Hugging Face GPT-2 folder, whose logits and continuations
``transformers`` computes as the chapter's; ``ExportingTrainer.export`` is a subcommand LightningCLI adds like ``test``.
"""

import json
import shutil
from pathlib import Path

import lightning.pytorch as pl
from safetensors.torch import save_file

from gpt_lit.errors import GptLitError
from gpt_lit.hub.gpt2 import EOT_ID, hf_config, hf_state
from gpt_lit.model import GPT
from gpt_lit.run.checkpoints import read_checkpoint
from gpt_lit.tokenizer import ENDOFTEXT, _bpe_files

# What the folder holds.
FILES = ["config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
         "tokenizer_config.json"]  # fmt: skip


def export_model(model: GPT, out: Path, max_new_tokens: int) -> None:
    """Write ``model`` into the folder ``out`` (created; files of the same names replaced) as listed in FILES;
    ``max_new_tokens`` is ``predict``'s, for its greedy decoding in ``generation_config.json``."""
    configs = {
        "config.json": hf_config(model.cfg),  # first: a model GPT-2 cannot compute is refused before the folder
        "generation_config.json": {  # at most half the context: GPT-2 has no position past n_positions
            "do_sample": False,
            "max_new_tokens": max(1, min(max_new_tokens, model.cfg.context_length // 2)),
            **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"), EOT_ID),
        },
        "tokenizer_config.json": {
            "tokenizer_class": "GPT2Tokenizer",
            "model_max_length": model.cfg.context_length,
            **dict.fromkeys(("bos_token", "eos_token", "unk_token"), ENDOFTEXT),
            "add_prefix_space": False,
        },
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GptLitError(f"export: cannot create --out {out} ({e.strerror or e}); choose another folder") from None
    if any(out.iterdir()) and not (out / "config.json").is_file():
        raise GptLitError(f"export: --out {out} is a folder with other files in it; give a new or empty folder")
    for name, config in configs.items():
        (out / name).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(hf_state(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    vocab_bpe, encoder_json = _bpe_files()  # GPT-2's tokenizer files, checked against their sha256 hashes
    shutil.copyfile(encoder_json, out / "vocab.json")
    shutil.copyfile(vocab_bpe, out / "merges.txt")


class ExportingTrainer(pl.Trainer):
    """Lightning's Trainer with one more entry point, ``export``, which LightningCLI turns into a subcommand."""

    def export(
        self,
        model: pl.LightningModule,
        datamodule: pl.LightningDataModule | None = None,
        ckpt_path: str | None = None,
        out: str | None = None,
        weights_only: bool | None = None,
    ) -> Path:
        """Write a checkpoint's model as a Hugging Face GPT-2 folder (transformers' GPT2LMHeadModel, offline).

        Args:
            model: The configured model; the checkpoint's weights are loaded into it.
            datamodule: Unused (the tokenizer is GPT-2's).
            ckpt_path: The checkpoint: ``last``, ``best`` (the newest run's) or a file's path.
            out: The folder to write config.json, generation_config.json, model.safetensors and the tokenizer files to.
            weights_only: Set by the CLI from --trust_checkpoint.
        """
        if not ckpt_path or not out:
            missing = " and ".join(f"--{k}" for k, v in (("ckpt_path", ckpt_path), ("out", out)) if not v)
            raise GptLitError(f"export needs {missing}: e.g. export --ckpt_path last --out exported/")
        ckpt, _ = read_checkpoint(ckpt_path, trust=weights_only is False)
        model.load_state_dict(ckpt["state_dict"])
        folder = Path(out)
        export_model(model.model, folder, model.hparams.max_new_tokens)  # the run's, as its predict uses
        print(f"exported {ckpt_path} to {folder}/ ({', '.join(FILES)})")
        return folder
