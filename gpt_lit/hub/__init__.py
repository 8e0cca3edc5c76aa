"""The Hugging Face import and export: GPT-2's released weights into the chapter's GPT, and a trained GPT out.

``gpt2.py`` is the one table of GPT-2's config fields and tensor names, read both ways: by ``pretrained.py``
(``model.init_from``: a Hugging Face GPT-2 folder or hub name into the chapter's classes) and by ``export.py``
(``python -m gpt_lit export``: a checkpoint as a folder ``transformers`` loads). No ``transformers`` at run time:
``safetensors`` reads and writes the weights, ``huggingface_hub`` (optional) fetches a hub name. These modules
import the chapter's model, tokenizer and errors, and from gpt_lit/run/ the checkpoint reader and the command-line
names of GPTConfig's fields. The chapter's LightningModule imports ``pretrained.py`` (its ``init_from``), the CLI
imports ``fetch`` and the ``export`` subcommand's Trainer; nothing else imports from here.
"""
