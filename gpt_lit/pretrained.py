"""OpenAI's released GPT-2 weights in the chapter's classes: ``model.init_from``.

The source is a folder in Hugging Face's GPT-2 layout (``config.json`` + ``model.safetensors``, or
``pytorch_model.bin``), or a hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl) that ``huggingface_hub``
fetches into its usual cache. Hugging Face's ``GPT2LMHeadModel`` computes the chapter's GPT exactly; only
the names differ, and it stores the four projections of each block as ``Conv1D``, whose weight is
``[in, out]``: the transpose of ``nn.Linear``'s. Its fused ``c_attn`` is q, k, v side by side, heads of
consecutive numbers: the chapter's ``qkv`` layout, so it maps over unchanged (transposed).

Two key layouts occur: the files on the hub have no ``transformer.`` prefix and carry each block's causal
mask as a buffer (``h.N.attn.bias``, ``h.N.attn.masked_bias``); ``save_pretrained`` writes the prefix and no
buffers. Both load. No ``transformers`` at run time: ``safetensors`` reads the weights, ``torch.load`` with
``weights_only=True`` the ``.bin`` files (tensors only, no code runs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from gpt_lit.errors import GptLitError
from gpt_lit.model import GPT, GPTConfig
from gpt_lit.run.cli_keys import cli_key

# The released sizes on the hub: the name a user types -> the repository.
HUB_MODELS = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
}
# What is fetched from the hub: the config and the safetensors weights (one file, or shards and their index).
HUB_FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"]
# Weight files of a folder, in order of preference (an index lists the shards of a large model).
WEIGHT_FILES = [
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
]
# GPT2Config's defaults, for config.json files that leave a field out.
HF_DEFAULTS = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "tie_word_embeddings": True,
}
# The GPTConfig fields the weights fix (named on the command line by ``cli_key``).
ARCH_FIELDS = ("vocab_size", "emb_dim", "n_layers", "n_heads", "qkv_bias", "tie_weights", "residual")
# Per-block tensors: Hugging Face name -> the chapter's name, and whether it is a Conv1D weight (transposed).
BLOCK_TENSORS = {
    "ln_1.weight": ("norm1.weight", False),
    "ln_1.bias": ("norm1.bias", False),
    "attn.c_attn.weight": ("attn.qkv.weight", True),
    "attn.c_attn.bias": ("attn.qkv.bias", False),
    "attn.c_proj.weight": ("attn.proj.weight", True),
    "attn.c_proj.bias": ("attn.proj.bias", False),
    "ln_2.weight": ("norm2.weight", False),
    "ln_2.bias": ("norm2.bias", False),
    "mlp.c_fc.weight": ("ffn.fc.weight", True),
    "mlp.c_fc.bias": ("ffn.fc.bias", False),
    "mlp.c_proj.weight": ("ffn.proj.weight", True),
    "mlp.c_proj.bias": ("ffn.proj.bias", False),
}
QKV_BIAS = "attn.c_attn.bias"  # GPT-2 always has it; the chapter's qkv_bias=false model does not
# The hub files' causal-mask buffers: not weights, the chapter's attention masks with is_causal instead.
MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


def how_to_download(name: str) -> str:
    """The manual route for a hub name: which files, from where, into which folder, and how to point at it."""
    repo, folder = HUB_MODELS[name], f"models/{name}"
    return (
        f"download config.json and model.safetensors from https://huggingface.co/{repo}/tree/main into a folder "
        f"such as {folder}/ (or: hf download {repo} config.json model.safetensors --local-dir {folder}), then "
        f"use --model.init_from {folder}"
    )


def _first_sentence(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text.split(". ")[0][:200]


def fetch(init_from: str, download: bool = True) -> Path:
    """The folder ``init_from`` names: a local folder as it is, or a hub name's snapshot in the hub's cache.

    With ``download=True`` a hub name is downloaded when not yet cached (``huggingface_hub.snapshot_download``,
    the config and the safetensors weights only); with ``False`` only the cache is looked at.
    """
    path = Path(init_from).expanduser()
    if path.is_dir():
        return path  # an existing folder wins over a hub name of the same spelling
    if path.exists():
        raise GptLitError(
            f"model.init_from {init_from} is a file: give the folder that holds config.json and model.safetensors "
            f"(or pytorch_model.bin)"
        )
    if init_from not in HUB_MODELS:
        raise GptLitError(
            f"model.init_from {init_from}: no such folder, and not one of the GPT-2 hub names ({', '.join(HUB_MODELS)})"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise GptLitError(
            f"model.init_from {init_from} is a Hugging Face hub name, and fetching it needs huggingface_hub: "
            f'pip install -e ".[hub]"; or {how_to_download(init_from)}'
        ) from None
    repo = HUB_MODELS[init_from]
    try:
        return Path(snapshot_download(repo, allow_patterns=HUB_FILES, local_files_only=not download))
    except Exception as e:  # no network, offline mode, a partial cache, an HTTP error: one line, what to do
        reason = _first_sentence(e.__cause__ or e)
        what = "download" if download else "find in the Hugging Face cache"
        raise GptLitError(f"cannot {what} {repo} ({reason}); {how_to_download(init_from)}") from None


def read_config(folder: Path) -> dict:
    """GPTConfig's fields as ``folder/config.json`` sets them (context_length: the position table's rows)."""
    file = folder / "config.json"
    if not file.is_file():
        raise GptLitError(
            f"{folder} has no config.json: a Hugging Face GPT-2 folder holds config.json and model.safetensors "
            f"(or pytorch_model.bin)"
        )
    try:
        hf = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GptLitError(f"{file} is not a JSON file ({_first_sentence(e)})") from None
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        found = hf.get("model_type") if isinstance(hf, dict) else None
        raise GptLitError(
            f"{file} is not a GPT-2 config (model_type {found!r}, not 'gpt2'): model.init_from loads GPT-2's "
            f"weights (gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a fine-tune of them) into the chapter's GPT"
        )
    hf = {**HF_DEFAULTS, **hf}
    sizes = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
    bad = [k for k in sizes if isinstance(hf[k], bool) or not isinstance(hf[k], int) or hf[k] <= 0]
    if bad:
        raise GptLitError(f"{file}: {', '.join(f'{k}={hf[k]!r}' for k in bad)} is not a positive integer")
    # Variants GPT2Config allows that the chapter's GPT does not compute.
    unsupported = [
        f"{key}={hf[key]!r}"
        for key, ok in (
            ("activation_function", hf["activation_function"] in ("gelu_new", "gelu_pytorch_tanh")),
            ("layer_norm_epsilon", hf["layer_norm_epsilon"] == 1e-5),
            ("n_inner", hf["n_inner"] in (None, 4 * hf["n_embd"])),
            ("scale_attn_weights", hf["scale_attn_weights"] is True),
            ("scale_attn_by_inverse_layer_idx", hf["scale_attn_by_inverse_layer_idx"] is False),
        )
        if not ok
    ]
    if unsupported:
        raise GptLitError(
            f"{file} sets {', '.join(unsupported)}: a GPT-2 variant the chapter's GPT does not compute (it has the "
            f"tanh GELU, layer-norm eps 1e-5, a 4x feed-forward and attention scaled by 1/sqrt(head_dim))"
        )
    return {
        "vocab_size": hf["vocab_size"],
        "context_length": hf["n_positions"],
        "emb_dim": hf["n_embd"],
        "n_layers": hf["n_layer"],
        "n_heads": hf["n_head"],
        # GPT-2's Conv1D projections always have biases; `python -m gpt_lit export` writes qkv_bias false (a key
        # transformers keeps but does not read) for a model without them, whose biases it writes as zeros.
        "qkv_bias": hf.get("qkv_bias", True) is not False,
        "tie_weights": bool(hf["tie_word_embeddings"]),
        "residual": True,
    }


def check_config(source: str, theirs: dict, cfg: GPTConfig) -> None:
    """One GptLitError naming every configured field that differs from the weights' (context_length may be shorter)."""
    differ = [k for k in ARCH_FIELDS if theirs[k] != getattr(cfg, k)]
    details = [
        f"{cli_key(k)} is {json.dumps(theirs[k])} in the weights but {json.dumps(getattr(cfg, k))} here"
        for k in differ
    ]
    fixes = [f"--{cli_key(k)} {json.dumps(theirs[k])}" for k in differ if k != "vocab_size"]
    if cfg.context_length > theirs["context_length"]:
        details.append(
            f"data.context_length is {cfg.context_length} here, longer than the weights' position table "
            f"({theirs['context_length']} positions)"
        )
        fixes.append(f"--data.context_length {theirs['context_length']} (or less)")
    if details:
        fix = f"; use {' '.join(fixes)}" if fixes else ""
        raise GptLitError(f"{source} does not fit the configured model: {'; '.join(details)}{fix}")


def _weight_files(folder: Path) -> list[Path]:
    for name in WEIGHT_FILES:
        file = folder / name
        if not file.is_file():
            continue
        if not name.endswith(".index.json"):
            return [file]
        try:
            shards = sorted(set(json.loads(file.read_text(encoding="utf-8"))["weight_map"].values()))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise GptLitError(f"{file} is not a shard index with a weight_map ({_first_sentence(e)})") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise GptLitError(f"{file} lists {len(missing)} shard(s) that are not in {folder} (e.g. {missing[0]})")
        return [folder / s for s in shards]
    raise GptLitError(f"{folder} has no weights: it needs model.safetensors (or pytorch_model.bin) beside config.json")


def _is_mask(key: str) -> bool:
    return MASK_BUFFER.fullmatch(key.removeprefix("transformer.")) is not None


def _read_file(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of one weight file, without the causal-mask buffers; a GptLitError when it is unreadable."""
    try:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), framework="pt", device="cpu") as f:
                return {k: f.get_tensor(k) for k in f.keys() if not _is_mask(k)}
        state = torch.load(file, map_location="cpu", weights_only=True)  # tensors only: no code in it runs
    except Exception as e:  # truncated, corrupt, or not this format at all
        kind = "safetensors" if file.suffix == ".safetensors" else "PyTorch"
        raise GptLitError(
            f"{file} is not a readable {kind} file: truncated or corrupt ({_first_sentence(e)}); download it again"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise GptLitError(f"{file} is a PyTorch file but not a state_dict of tensors")
    return {k: v for k, v in state.items() if not _is_mask(k)}


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's GPT-2 tensors by their Hugging Face names without the ``transformer.`` prefix, masks dropped."""
    state: dict[str, torch.Tensor] = {}
    for file in _weight_files(folder):
        state.update({k.removeprefix("transformer."): v for k, v in _read_file(file).items()})
    return state


def key_table(cfg: GPTConfig) -> dict[str, tuple[str, bool]]:
    """Every tensor of ``GPT(cfg)`` that GPT-2 stores: its Hugging Face name (without the ``transformer.``
    prefix; ``lm_head.weight`` for an untied head) -> (the chapter's name, whether it is a Conv1D weight, stored
    transposed). The one table both directions use: ``to_chapter`` (model.init_from) and ``to_hugging_face``
    (``python -m gpt_lit export``). A tied head is ``tok_emb.weight`` itself; without ``qkv_bias`` the chapter has
    no q, k, v biases (GPT-2's are zeros then)."""
    table = {
        "wte.weight": ("tok_emb.weight", False),
        "wpe.weight": ("pos_emb.weight", False),
        "ln_f.weight": ("final_norm.weight", False),
        "ln_f.bias": ("final_norm.bias", False),
    }
    for i in range(cfg.n_layers):
        for theirs, (ours, conv1d) in BLOCK_TENSORS.items():
            if theirs != QKV_BIAS or cfg.qkv_bias:
                table[f"h.{i}.{theirs}"] = (f"blocks.{i}.{ours}", conv1d)
    if not cfg.tie_weights:
        table["lm_head.weight"] = ("head.weight", False)
    return table


def zero_qkv_biases(hf: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, str]:
    """GPT-2's q, k, v biases of a model without them: name -> "" when all zeros, else why it cannot be dropped."""
    if cfg.qkv_bias:
        return {}
    names = [f"h.{i}.{QKV_BIAS}" for i in range(cfg.n_layers)]
    return {k: "" if not hf[k].any() else "non-zero q, k, v biases" for k in names if k in hf}


def to_chapter(hf: dict[str, torch.Tensor], cfg: GPTConfig, source: str) -> dict[str, torch.Tensor]:
    """Hugging Face GPT-2 tensors -> the state_dict of ``GPT(cfg)``: renamed, Conv1D weights transposed,
    the position table cut to ``cfg.context_length`` rows."""
    table = key_table(cfg)
    zero_biases = zero_qkv_biases(hf, cfg)
    nonzero = [k for k, why in zero_biases.items() if why]
    missing = [k for k in table if k not in hf]
    unexpected = [k for k in hf if k not in table and k != "lm_head.weight" and k not in zero_biases]
    if missing or unexpected or nonzero:
        what = []
        if missing:
            what.append(f"{len(missing)} of GPT-2's tensors missing (e.g. {missing[0]})")
        if unexpected:
            what.append(f"{len(unexpected)} tensors GPT-2's language model does not have (e.g. {unexpected[0]})")
        if nonzero:
            what.append(f"{nonzero[0]} is not zero, but config.json says qkv_bias false")
        raise GptLitError(f"{source} is not a GPT-2 language model of its config.json's size: {'; '.join(what)}")
    state = {ours: (hf[theirs].t() if conv1d else hf[theirs]) for theirs, (ours, conv1d) in table.items()}
    state["pos_emb.weight"] = state["pos_emb.weight"][: cfg.context_length]  # a shorter context: the first rows
    if cfg.tie_weights:
        state["head.weight"] = state["tok_emb.weight"]
    return state


def to_hugging_face(state: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """The state_dict of ``GPT(cfg)`` -> ``GPT2LMHeadModel``'s tensors as ``save_pretrained`` writes them
    (``transformer.`` prefix; ``lm_head.weight`` only when untied; zero q, k, v biases without ``qkv_bias``)."""
    out = {}
    for theirs, (ours, conv1d) in key_table(cfg).items():
        tensor = state[ours].detach().cpu()
        name = theirs if theirs == "lm_head.weight" else f"transformer.{theirs}"
        out[name] = (tensor.t() if conv1d else tensor).contiguous().clone()  # own storage: safetensors needs it
    if not cfg.qkv_bias:
        for i in range(cfg.n_layers):
            out[f"transformer.h.{i}.{QKV_BIAS}"] = torch.zeros(3 * cfg.emb_dim)
    return out


def load_pretrained(model: GPT, init_from: str, download: bool = False) -> Path:
    """Copy GPT-2's weights from ``init_from`` (folder or hub name) into ``model``; returns the folder read.

    The architecture in its config.json must be ``model.cfg``'s, except context_length: the model's may be
    shorter, and keeps the first rows of the position table. Anything else is one GptLitError line.
    """
    folder = fetch(init_from, download=download)
    source = f"model.init_from {init_from}" + (f" ({folder})" if str(folder) != init_from else "")
    check_config(source, read_config(folder), model.cfg)
    state = to_chapter(read_weights(folder), model.cfg, source)
    wanted = model.state_dict()
    shapes = [f"{k} {list(v.shape)} vs {list(wanted[k].shape)}" for k, v in state.items() if v.shape != wanted[k].shape]
    if shapes:
        raise GptLitError(f"{source}: the tensors do not have config.json's shapes: {', '.join(shapes[:3])}")
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
    return folder
