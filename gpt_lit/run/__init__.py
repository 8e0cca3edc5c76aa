"""A run's life: the CLI, its config files, checkpoints read and saved, the callbacks every run gets and what it
prints. The chapter's files and the diagnostics import nothing from here; hub/export.py's Trainer uses
checkpoints.py."""
