"""OpenAI's released GPT-2 weights in the chapter's classes (``model.init_from``): a folder in Hugging Face's GPT-2
layout (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``, sharded or not), or a hub name that
``huggingface_hub`` fetches into its cache."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from gpt_lit.errors import GptLitError, cli_key
from gpt_lit.hub.gpt2 import COMPUTED, CONFIG, DEFAULTS, conv1d, hf_name, missing_biases
from gpt_lit.model import GPT, GPTConfig

# The released sizes on the hub: the name a user types -> the repository.
HUB_MODELS = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
# What is fetched from the hub: the config and the safetensors weights (one file, or shards and their index).
HUB_FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"]
# Weight files of a folder, in order of preference (an index lists the shards of a large model).
WEIGHT_FILES = [name + index for name in ("model.safetensors", "pytorch_model.bin") for index in ("", ".index.json")]
SIZES = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")


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
    """The folder ``init_from`` names: a local folder, or a hub name's snapshot in the hub's cache (downloaded there
    first when missing, with ``download``)."""
    path = Path(init_from).expanduser()
    if path.is_dir():
        return path  # an existing folder wins over a hub name of the same spelling
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
    try:
        hf = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # missing, not UTF-8, not JSON
        why = e.strerror if isinstance(e, OSError) else _first_sentence(e)
        raise GptLitError(f"{file} is not a readable JSON file ({why}): a GPT-2 folder holds config.json") from None
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        found = hf.get("model_type") if isinstance(hf, dict) else None
        raise GptLitError(
            f"{file} is not a GPT-2 config (model_type {found!r}, not 'gpt2'): model.init_from loads GPT-2's "
            f"weights (gpt2, gpt2-medium, gpt2-large, gpt2-xl, or a fine-tune of them) into the chapter's GPT"
        )
    hf = {**DEFAULTS, **hf}
    bad = [f"{k}={hf[k]!r}" for k in SIZES if type(hf[k]) is not int or hf[k] <= 0]
    if not bad:
        allowed = {**COMPUTED, "n_inner": (None, 4 * hf["n_embd"])}
        bad = [f"{k}={hf[k]!r}" for k, values in allowed.items() if hf[k] not in values]
    if bad:
        raise GptLitError(
            f"{file} sets {', '.join(bad)}: not a GPT-2 the chapter's GPT computes (positive sizes, the tanh GELU, "
            f"layer-norm eps 1e-5, a 4x feed-forward and attention scaled by 1/sqrt(head_dim))"
        )
    return {ours: hf[theirs] for ours, theirs in CONFIG.items()} | {"residual": True}


def check_config(source: str, theirs: dict, cfg: GPTConfig) -> None:
    """One GptLitError naming every configured field that differs from the weights' (context_length may be shorter)."""
    differ = [k for k in theirs if k != "context_length" and theirs[k] != getattr(cfg, k)]
    details = [f"{cli_key(k)} is {json.dumps(theirs[k])} in the weights but {json.dumps(getattr(cfg, k))} here"
               for k in differ]  # fmt: skip
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


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors by ``GPT2LMHeadModel``'s names (the ``transformer.`` prefix added where it is left out)."""
    name = next((name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if name is None:
        raise GptLitError(
            f"{folder} has no weights: it needs model.safetensors (or pytorch_model.bin) beside config.json"
        )
    files = [folder / name]
    if name.endswith(".index.json"):
        try:
            shards = json.loads(files[0].read_text(encoding="utf-8"))["weight_map"]
            files = [folder / shard for shard in sorted(set(shards.values()))]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise GptLitError(f"{files[0]} is not a shard index with a weight_map ({_first_sentence(e)})") from None
    state = {}
    for file in files:
        if not file.is_file():
            raise GptLitError(f"{file} is missing: {name} lists it as a shard; download it again")
        safetensors = file.suffix == ".safetensors"
        try:  # torch.load with weights_only: tensors only, no code runs
            part = load_file(file) if safetensors else torch.load(file, map_location="cpu", weights_only=True)
        except Exception as e:  # truncated, corrupt, or not this format at all
            kind = "safetensors" if safetensors else "PyTorch"
            raise GptLitError(
                f"{file} is not a readable {kind} file: truncated or corrupt ({_first_sentence(e)}); download it again"
            ) from None
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise GptLitError(f"{file} holds no state_dict of tensors: not a Hugging Face weights file")
        state.update(part)
    return {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v for k, v in state.items()}


def load_pretrained(model: GPT, init_from: str) -> Path:
    """Copy GPT-2's weights from ``init_from`` into ``model`` (a shorter context keeps the first positions); returns
    the folder read."""
    folder = fetch(init_from, download=False)  # a hub name: from the cache, where prepare_data put it
    source = f"model.init_from {init_from}" + (f" ({folder})" if str(folder) != init_from else "")
    cfg = model.cfg
    check_config(source, read_config(folder), cfg)
    theirs, state, wrong = read_weights(folder), {}, []
    for key, wanted in model.state_dict().items():
        name = hf_name("tok_emb.weight" if key == "head.weight" and cfg.tie_weights else key)
        if name not in theirs:
            wrong.append(f"{name} missing")
            continue
        tensor = conv1d(key, theirs[name])
        state[key] = tensor[: cfg.context_length] if key == "pos_emb.weight" else tensor  # a shorter context: its rows
        if state[key].shape != wanted.shape:
            wrong.append(f"{name} is {list(state[key].shape)}, not {list(wanted.shape)}")
    wrong += [f"{name} is not zero (config.json: qkv_bias false)" for name in missing_biases(cfg)
              if name in theirs and theirs[name].any()]  # fmt: skip
    if wrong:
        raise GptLitError(f"{source} is not a GPT-2 language model of its config.json: {', '.join(wrong[:3])}")
    model.load_state_dict(state)
    return folder
