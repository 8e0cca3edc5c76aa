"""GPT-2 in Hugging Face's names, the one table ``model.init_from`` and ``export`` read: ``GPT2LMHeadModel`` is the
chapter's GPT with other names, and each block's projections ``Conv1D``s, whose weight is ``nn.Linear``'s transposed.
"""

import torch

from gpt_lit.errors import GptLitError
from gpt_lit.model import GPT, GPTConfig

# GPTConfig's field -> GPT2Config's; qkv_bias is gpt_lit's own (GPT-2 has the biases; export writes zeros for none).
CONFIG = {"vocab_size": "vocab_size", "context_length": "n_positions", "emb_dim": "n_embd", "n_layers": "n_layer",
          "n_heads": "n_head", "qkv_bias": "qkv_bias", "tie_weights": "tie_word_embeddings"}  # fmt: skip
# GPT2Config's settings the chapter's GPT computes: the values it accepts, export writing the first.
COMPUTED = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "layer_norm_epsilon": (1e-5,), "n_inner": (None,),
            "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,)}  # fmt: skip
# The parts of a state_dict key: the chapter's module name -> GPT-2's (blocks.0.ffn.fc.weight -> h.0.mlp.c_fc.weight).
NAMES = {"tok_emb": "wte", "pos_emb": "wpe", "blocks": "h", "norm1": "ln_1", "qkv": "c_attn", "proj": "c_proj",
         "norm2": "ln_2", "ffn": "mlp", "fc": "c_fc", "final_norm": "ln_f", "head": "lm_head"}  # fmt: skip
EOT_ID = 50256  # <|endoftext|>: GPT-2's one special token, its bos, eos and unk


def hf_name(key: str) -> str:
    """``GPT2LMHeadModel``'s name for the chapter's state_dict ``key``, as ``save_pretrained`` writes it."""
    name = ".".join(NAMES.get(part, part) for part in key.split("."))
    return name if name.startswith("lm_head.") else f"transformer.{name}"


def conv1d(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """A block's projection weight turned between ``nn.Linear``'s layout and ``Conv1D``'s (either way: a transpose)."""
    return tensor.t() if key.startswith("blocks.") and tensor.ndim == 2 else tensor


def missing_biases(cfg: GPTConfig) -> list[str]:
    """GPT-2's q, k, v biases that a model without ``qkv_bias`` lacks: zeros in GPT-2's terms."""
    return [] if cfg.qkv_bias else [hf_name(f"blocks.{i}.attn.qkv.bias") for i in range(cfg.n_layers)]


def hf_config(cfg: GPTConfig) -> dict:
    """``config.json`` for a model of ``cfg``. Dropout is the model's (transformers uses it only when training)."""
    if not cfg.residual:
        raise GptLitError(
            "export: the model has no residual connections (model.config.residual false), which GPT-2's "
            "architecture always has, so transformers cannot compute it; export a run with residual true"
        )
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        **{theirs: getattr(cfg, ours) for ours, theirs in CONFIG.items()},
        **{key: values[0] for key, values in COMPUTED.items()},
        **dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), cfg.dropout),
        "bos_token_id": EOT_ID,
        "eos_token_id": EOT_ID,
    }


# What a config.json that leaves a field out means: GPT2Config's defaults, which are GPT-2 124M's (tied head).
DEFAULTS = hf_config(GPTConfig(tie_weights=True))


def hf_state(model: GPT) -> dict[str, torch.Tensor]:
    """``model``'s tensors as ``save_pretrained`` writes ``GPT2LMHeadModel``'s (a tied head once, as ``wte``)."""
    state = {
        hf_name(key): conv1d(key, tensor).detach().cpu().contiguous()
        for key, tensor in model.state_dict().items()
        if not (key == "head.weight" and model.cfg.tie_weights)
    }
    return state | {name: torch.zeros(3 * model.cfg.emb_dim) for name in missing_biases(model.cfg)}
