"""The documented path: train, press Ctrl-C, run the printed resume command to the end, then ``test`` and
``predict`` the run's ``last``/``best`` checkpoint: they use the final run's weights, quietly.

Every stop at every moment, compared with an uninterrupted run value by value: test_fault_matrix.py.
"""

import shlex
import signal
import warnings

import torch
from conftest import REPO, TINY
from lightning.pytorch.callbacks import Callback

from gpt_lit.cli import main

RUN = [
    "--config", str(REPO / "configs/residual.yaml"), *TINY, "--data.eval_train", "false",
    "--data.eval_batch_size", "8", "--trainer.max_epochs", "3",
    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


class CtrlCAt(Callback):
    """Press Ctrl-C once (SIGINT to this process) in the middle of training step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            signal.raise_signal(signal.SIGINT)


def test_ctrl_c_then_the_printed_command_then_test_and_predict_use_the_final_weights(tmp_path, capfd):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (CI may ignore SIGINT)
    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path)]
    try:
        try:
            main(["fit", *RUN, *logs], extra_callbacks=[CtrlCAt(step=1)])  # epoch 0's second (last) step
        except SystemExit as stopped:
            assert stopped.code == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    run = tmp_path / "residual" / "version_0"
    err = capfd.readouterr().err
    assert "finishing this step; Ctrl-C again to stop at once" in err and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line == (
        f"error: fit stopped by Ctrl-C; resume with: python -m gpt_lit fit --config {run / 'config.yaml'} "
        f"--ckpt_path {run / 'checkpoints' / 'last.ckpt'} --trainer.logger.init_args.version 0"
    )
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 2  # the step, epoch 0's evaluation and its end: all done before stopping

    main(shlex.split(line.split("resume with: ")[1])[3:])
    final = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert final["global_step"] == 6 and final["epoch"] == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best-epoch02.ckpt", "last.ckpt"]

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        main(["test", *RUN, *logs, "--ckpt_path", "last"])  # the newest run of the config's name
        main(["test", *RUN, *logs, "--ckpt_path", "best"])
    assert (run / "test" / "last").is_dir() and (run / "test" / "best-epoch02").is_dir()
    assert not [w for w in said if "dirpath has changed" in str(w.message)]
