import gc

from gpt_lit.run.cli import main


def run() -> None:
    """``python -m gpt_lit`` and the ``gpt-lit`` command: a whole process's command."""
    # What the imports made (torch, Lightning, jsonargparse: most of the process's objects) lives until the process
    # ends; frozen, Python's full garbage collections during the run, and the one at its exit, skip over it.
    gc.freeze()
    main()


if __name__ == "__main__":
    run()
