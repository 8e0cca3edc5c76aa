"""A run's life: what a command does from its command line to its last line of output.

``cli.py`` is ``python -m gpt_lit`` (LightningCLI over the chapter's GPTLightning and TimeMachineData);
``parser.py`` reads the command line and config files (a shipped config by name, a run's own config.yaml) and
says where a bad value came from; ``plan.py`` decides once what a command does with its checkpoint, which
``reading.py`` reads as data (``weights_only``) and checks against the configured model; ``folders.py`` finds a
run's folder and its ``last``/``best`` checkpoints and where validate/test/predict write; ``last_checkpoint.py``
keeps ``last.ckpt`` the newest exact state and turns Ctrl-C and SIGTERM into a save and a stop; ``saving.py``
writes checkpoints on Lightning's CheckpointIO plugins; ``finite_loss.py`` and ``rng_state.py`` are the two
callbacks every run gets; ``console.py`` what a run prints. These modules import the chapter's model, module and
data (gpt_lit/*.py) and Lightning. The chapter's files and the diagnostics (gpt_lit/callbacks/) import nothing
from here; the Hugging Face import and export (pretrained.py, export.py) use ``reading.py`` and ``cli_keys.py``.
"""
