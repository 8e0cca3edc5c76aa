"""The prompts ``predict`` continues: from the config or a text file, as a dataset of token IDs."""

import warnings
from pathlib import Path

import torch
from torch.utils.data import Dataset

from gpt_lit.errors import GptLitError
from gpt_lit.tokenizer import encode


def read_prompts_file(path: str) -> list[str]:
    """The prompts in a UTF-8 text file, one a line (split on ``\n`` and ``\r\n`` only, blank lines skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise GptLitError(f"data.prompts_file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise GptLitError(
            f"cannot read data.prompts_file {path} ({e.strerror or e}); give a text file with one prompt a line"
        ) from None
    lines = (line.removesuffix("\r") for line in text.split("\n"))
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise GptLitError(f"data.prompts_file {path} holds no prompt (no line with text); write one prompt a line")
    return prompts


def read_prompts(prompts: list[str] | None, prompts_file: str | None) -> list[str]:
    """``predict``'s prompts: data.prompts, then data.prompts_file's; none, or an empty one, is a GptLitError."""
    prompts = list(prompts or []) + (read_prompts_file(prompts_file) if prompts_file else [])
    if not prompts:
        raise GptLitError("predict needs prompts: set data.prompts in the config or data.prompts_file")
    for n, text in enumerate(prompts, 1):
        if not text.strip():
            raise GptLitError(f"prompt {n} is empty: give every prompt some text to continue")
    return prompts


class Prompts(Dataset):
    """Prompts for ``predict``: item i is (i, the prompt's token IDs), the index for putting the continuations of
    several processes back in order and for each prompt's generator."""

    def __init__(self, prompts: list[str], context_length: int):
        self.texts, self.ids = [], []
        for n, text in enumerate(prompts, 1):
            ids = encode(text)  # as the book is: all of it ordinary text
            if len(ids) > context_length:
                warnings.warn(
                    f"prompt {n} has {len(ids)} tokens, more than context_length={context_length}; "
                    f"the model sees only its last {context_length} tokens",
                    stacklevel=2,
                )
            self.texts.append(text)
            self.ids.append(torch.tensor(ids))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, self.ids[i]
