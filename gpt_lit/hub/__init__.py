"""The Hugging Face import and export: GPT-2's released weights into the chapter's GPT, and a trained GPT out.

``gpt2.py`` is the one table of GPT-2's names, which ``pretrained.py`` (``model.init_from``) and ``export.py``
(``python -m gpt_lit export``) both read; ``safetensors`` reads and writes the weights, no ``transformers``. They
import the chapter's model, tokenizer and errors, and gpt_lit/run/'s checkpoint reader and field names; the module
imports ``pretrained.py``, the CLI ``fetch`` and the ``export`` Trainer.
"""
