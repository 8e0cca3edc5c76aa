"""The Hugging Face import (``pretrained.py``, ``model.init_from``) and export (``export.py``), by one table of GPT-2's
names (``gpt2.py``), with ``safetensors``, no ``transformers``. They import the chapter's model, tokenizer and errors
(export's Trainer also gpt_lit/run/'s checkpoint reader); the module imports pretrained.py, the CLI both.
"""
