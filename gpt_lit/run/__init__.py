"""A run's life: the CLI (cli.py), the command line and config files (parser.py), what a command does with its
checkpoint (folders.py, reading.py), saving and stopping (last_checkpoint.py, saving.py), the callbacks every
run gets (callbacks.py) and what it prints (console.py). The chapter's files and the diagnostics
import nothing from here; the Hugging Face folder (gpt_lit/hub/) uses reading.py."""
