"""``--ckpt_path best`` is the state that earned its ``loss/val``, whatever ``val_check_interval`` says: `test` on it
prints the lowest ``loss/val`` the run logged (the test set is the validation set, evaluated whole).

residual.yaml without its diagnostics, the tiny model; 2 epochs of 5 steps, validated in the middle of each epoch but
not after its last step, so that a best file saved at an epoch's end would hold a state no validation measured.
"""

import re

import pytest
import torch
from conftest import TINY, residual_without_diagnostics, scalars
from test_cli import run_main

RUN = [
    "--config", residual_without_diagnostics(), *TINY, "--data.eval_train", "false", "--model.lr", "0.01",
    "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "5",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


@pytest.mark.parametrize(
    "interval",
    ["0.5", pytest.param("3", marks=pytest.mark.full)],  # full: another interval
    ids=["half an epoch", "every 3 batches"],
)
def test_best_holds_the_weights_its_validation_loss_was_measured_on(tmp_path, capsys, monkeypatch, interval):
    monkeypatch.chdir(tmp_path)
    args = [*RUN, "--trainer.val_check_interval", interval]
    code, _, err = run_main(capsys, "fit", *args)
    assert code == 0, err[-3000:]
    run = tmp_path / "lightning_logs" / "residual" / "version_0"
    losses = [value for _, value in scalars(run)["loss/val"]]
    assert len(losses) == (4 if interval == "0.5" else 2)  # after steps 2 and 4 of each epoch, or step 3
    [best] = (run / "checkpoints").glob("best-epoch*.ckpt")
    assert best.name == f"best-epoch{torch.load(best, weights_only=False)['epoch']:02d}.ckpt"
    code, out, err = run_main(capsys, "test", *args, "--ckpt_path", "best")
    assert code == 0, err[-3000:]
    loss = float(re.search(r"test/loss\s*[│|]\s*([\d.]+)", out).group(1))  # the table a reader sees
    assert loss == pytest.approx(min(losses), abs=1e-4)
