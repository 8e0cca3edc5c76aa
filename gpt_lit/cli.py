"""``python -m gpt_lit {fit,validate,test,predict}``: LightningCLI over GPTLightning and TimeMachineData."""

from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from gpt_lit.data import TimeMachineData
from gpt_lit.errors import GptLitError
from gpt_lit.module import GPTLightning
from gpt_lit.tokenizer import vocab_size


class GPTLitCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The model's position table and vocabulary come from the data, so the two can never disagree.
        parser.link_arguments("data.context_length", "model.config.context_length")
        parser.link_arguments("data.tokenizer", "model.config.vocab_size", compute_fn=vocab_size)


def main(args: list[str] | None = None) -> None:
    try:
        GPTLitCLI(
            GPTLightning,
            TimeMachineData,
            args=args,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": "Train, evaluate and run the GPT of 'The transformer block'."},
        )
    except (GptLitError, MisconfigurationException, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
