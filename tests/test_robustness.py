"""Mistakes a reader will make, each answered by one `error:` line and exit code 2, never a traceback.

The cases run `python -m gpt_lit` in this process (``main(args)``, the very function the command runs), so
that a dozen of them take seconds; an exception escaping ``main`` would fail the test as it would print a
traceback in a terminal. test_readme.py and test_ddp.py run the command in processes of their own.
"""

import math
import os
import signal

import pytest
import torch
from conftest import TINY, residual_without_diagnostics
from lightning.pytorch.callbacks import Callback

from gpt_lit.run.cli import main

RUN = [  # its diagnostics left out: these tests read none
    "--config", residual_without_diagnostics(), *TINY,
    "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


def error_line(capsys, *args: str) -> str:
    """Run `python -m gpt_lit <args>`; check it exits with status 2 and one `error:` line; return that line."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-2000:]
    assert "Traceback" not in err and "usage:" not in err
    return errors[0]


@pytest.fixture()
def run_dir(tiny_run):
    """The session's tiny finished run: lightning_logs/residual/version_0 with config.yaml and last.ckpt."""
    return tiny_run.version


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # lightning_logs/ of the runs that get that far go here


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model.config.colour", "red"], ["model.config.colour"]),
        (["--model.config.emb_dim", "abc"], ["model.config.emb_dim: expected int, got 'abc'"]),
        (["--trainer.max_epochs", "ten"], ["trainer.max_epochs: expected int or null, got 'ten'"]),
        (["--model.config.emb_dim", "33"], ["emb_dim (33) must be divisible by", "n_heads (2)"]),
        (["--model.config.dropout", "-0.1"], ["dropout must be in [0, 1), got -0.1"]),
        (["--model.config.context_length", "64"], ['"model.config.context_length" must be given via', "data"]),
        (["--model.lr", "0"], ["model.lr must be > 0"]),
    ],
    ids=[
        "unknown key",
        "not an int",
        "not an int or null",
        "emb_dim % n_heads",
        "negative dropout",
        "linked key",
        "lr",
    ],
)
def test_bad_config_value(capsys, args, words):
    line = error_line(capsys, "fit", *RUN, *args)
    for w in words:
        assert w in line


def test_unknown_key_or_bad_value_in_a_config_file_names_the_file_and_line(capsys, tmp_path):
    (tmp_path / "mine.yaml").write_text("model:\n  config:\n    colour: red\n")
    line = error_line(capsys, "fit", *RUN, "--config", "mine.yaml")
    assert "model.config.colour" in line and "(in mine.yaml, line 3;" in line
    (tmp_path / "mine.yaml").write_text("data:\n  batch_size: 4\nmodel:\n  config:\n    emb_dim: abc\n")
    line = error_line(capsys, "fit", *RUN, "--config", "mine.yaml")
    assert "model.config.emb_dim: expected int, got 'abc' (in mine.yaml, line 5;" in line


def test_a_callback_that_does_not_import_is_named_with_why(capsys, tmp_path):
    (tmp_path / "mine.yaml").write_text("trainer:\n  callbacks:\n    - class_path: gpt_lit.diagnostics.Colour\n")
    line = error_line(capsys, "fit", *RUN, "--config", "mine.yaml")
    assert "trainer.callbacks: cannot use class_path 'gpt_lit.diagnostics.Colour': module 'gpt_lit.diagnostics' " \
        "has no attribute 'Colour'" in line  # fmt: skip


def test_bad_value_on_the_command_line_names_the_option(capsys):
    line = error_line(capsys, "fit", *RUN, "--model.config.emb_dim", "abc")
    assert "(from the command line: --model.config.emb_dim;" in line


def test_malformed_yaml_names_the_file_and_line(capsys, tmp_path):
    (tmp_path / "mine.yaml").write_text("model:\n  config:\n    emb_dim: [64\ndata:\n  batch_size: 4\n")
    line = error_line(capsys, "fit", *RUN, "--config", "mine.yaml")
    assert line.startswith("error: mine.yaml, line 4 is not valid YAML: ")


class Bug(Callback):
    """A bug in the code, as a user would meet it: an exception no input could cause."""

    def on_train_start(self, trainer, pl_module):
        a, b = [1, 2, 3]  # noqa: F841 (ValueError: too many values to unpack)


def test_a_bug_keeps_its_traceback_and_says_what_was_running(capsys):
    args = ["fit", *RUN, "--trainer.max_epochs", "1", '--trainer.callbacks+={"class_path": "test_robustness.Bug"}']
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    assert "Traceback" in err and "ValueError: too many values to unpack" in err and "in on_train_start" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: unexpected ValueError (a bug, not your input) while running: python -m gpt_lit fit")


class CtrlCTwice(Callback):
    """Press Ctrl-C twice (SIGINT to this process) in the middle of training step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)  # the first: finish this step ...
            os.kill(os.getpid(), signal.SIGINT)  # ... the second: stop at once


def test_a_second_ctrl_c_stops_at_once(capfd, tmp_path):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (CI may ignore SIGINT)
    try:
        press = '--trainer.callbacks+={"class_path": "test_robustness.CtrlCTwice", "init_args": {"step": 4}}'
        logs = ["--trainer.logger.init_args.save_dir", str(tmp_path)]
        with pytest.raises(SystemExit) as exit_:
            main(["fit", *RUN, "--trainer.max_epochs", "3", press, *logs])
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capfd.readouterr().err
    assert exit_.value.code == 130 and "Traceback" not in err
    assert "finishing this step; Ctrl-C again to stop at once" in err
    assert err.strip().splitlines()[-1].startswith("error: fit stopped by Ctrl-C; resume with: ")
    ckpt = torch.load(tmp_path / "residual" / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 3  # the last exact state, epoch 0's end (3 steps): step 4 was not finished


@pytest.mark.parametrize("accelerator", ["gpu", "cuda", "mps"])
def test_accelerator_the_machine_lacks(capsys, accelerator):
    has = ["cpu", *["cuda"] * torch.cuda.is_available(), *["mps"] * torch.backends.mps.is_available()]
    if accelerator in has or accelerator == "gpu" and len(has) > 1:
        pytest.skip(f"this machine has {accelerator}")
    line = error_line(capsys, "fit", *RUN, "--trainer.accelerator", accelerator)
    assert line == (
        f"error: --trainer.accelerator {accelerator}: Lightning finds no {accelerator.upper()} device on this "
        f"machine, which has: {', '.join(has)}; use --trainer.accelerator {' or '.join(has)}, or auto for the best "
        "of them"
    )


def test_fsdp_on_cpu_is_refused_with_one_line(capsys):
    line = error_line(capsys, "fit", *RUN, "--trainer.strategy", "fsdp", "--trainer.devices", "2")
    assert "fsdp" in line.lower() and "gpu" in line.lower(), line


@pytest.mark.parametrize("typo", [["--model.config.n_layer", "1"], ["--trainer.max_epoch=1"]], ids=["n_layer", "="])
def test_the_start_of_an_option_is_not_taken_for_it(capsys, tmp_path, typo):
    line = error_line(capsys, "fit", *RUN, "--trainer.max_epochs", "1", *typo)
    assert line == f"error: unrecognized arguments: {' '.join(typo)} (--help lists the options)"
    assert not (tmp_path / "lightning_logs").exists()  # nothing trained, nothing written


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", ["is empty"]),
        (b"\xff\xfe\x00not text", ["is not UTF-8"]),
        (b"*** START OF X ***\r\nA few words only.\r\n*** END OF X ***\r\n", ["too few for one window", "33"]),
    ],
    ids=["empty", "not UTF-8", "too short"],
)
def test_bad_data_file(capsys, tmp_path, content, words):
    (tmp_path / "pg35.txt").write_bytes(content)
    line = error_line(capsys, "fit", *RUN, "--data.data_dir", str(tmp_path), "--data.download", "false")
    assert line.startswith(f"error: {tmp_path / 'pg35.txt'}")
    for w in words:
        assert w in line


def test_log_directory_not_writable(capsys, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    logs = tmp_path / "a_file" / "logs"
    line = error_line(capsys, "fit", *RUN, "--trainer.logger.init_args.save_dir", str(logs))
    assert f"cannot write to the log directory {logs}" in line and "--trainer.logger.init_args.save_dir" in line


def test_checkpoint_that_is_missing_truncated_or_not_a_checkpoint(capsys, tmp_path, run_dir):
    config = ["--config", str(run_dir / "config.yaml")]
    line = error_line(capsys, "test", *config, "--ckpt_path", "nowhere/last.ckpt")
    assert line == "error: checkpoint nowhere/last.ckpt does not exist"

    half = tmp_path / "half.ckpt"
    data = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    half.write_bytes(data[: len(data) // 2])
    line = error_line(capsys, "test", *config, "--ckpt_path", str(half))
    assert f"{half} is not a readable checkpoint: truncated, or not a PyTorch file" in line

    notes = tmp_path / "notes.ckpt"
    notes.write_text("a text file\n")
    prompts = ["--data.prompts", '["The Time"]']  # predict reads its prompts first: they are given
    line = error_line(capsys, "predict", *config, *prompts, "--ckpt_path", str(notes))
    assert f"{notes} is not a readable checkpoint" in line

    weights = tmp_path / "weights.pt"
    torch.save({"tok_emb.weight": torch.zeros(3)}, weights)
    line = error_line(capsys, "test", *config, "--ckpt_path", str(weights))
    assert f"{weights} is a PyTorch file but not a Lightning checkpoint" in line


@pytest.mark.parametrize(
    "content", [b"a text file\n", b"", bytes(range(256)), "cut"], ids=["text", "empty", "bytes", "cut"]
)
def test_a_file_that_is_not_a_checkpoint(capsys, tmp_path, content):
    notes = tmp_path / "notes.ckpt"
    if content == "cut":  # a checkpoint cut short
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, notes)
        content = notes.read_bytes()[:3000]
    notes.write_bytes(content)
    line = error_line(capsys, "test", *RUN, "--ckpt_path", str(notes))
    assert line == f"error: {notes} is not a readable checkpoint: truncated, or not a PyTorch file (not a complete " \
        "zip archive, as every checkpoint is)"  # fmt: skip


@pytest.mark.parametrize(
    "change, words",
    [
        (["--model.config.emb_dim", "64"], ["model.config.emb_dim is 32 in the checkpoint but 64 here",
                                             "model.tok_emb.weight [50257, 32] vs [50257, 64]"]),
        (["--data.context_length", "64"], ["data.context_length is 32 in the checkpoint but 64 here",
                                            "model.pos_emb.weight [32, 32] vs [64, 32]"]),
        (["--model.config.n_layers", "3"], ["model.config.n_layers is 2 in the checkpoint but 3 here",
                                             "tensors missing from the checkpoint (e.g. model.blocks.2."]),
        (["--model.config.residual", "false"], ["model.config.residual is True in the checkpoint but False here"]),
    ],
    ids=["emb_dim", "context_length", "n_layers", "residual"],
)  # fmt: skip
def test_checkpoint_of_another_architecture(capsys, run_dir, change, words):
    ckpt = str(run_dir / "checkpoints" / "last.ckpt")
    line = error_line(capsys, "test", "--config", str(run_dir / "config.yaml"), *change, "--ckpt_path", ckpt)
    assert line.startswith(f"error: checkpoint {ckpt} is of a different architecture than the config:")
    assert line.endswith(f"use the run's own config: --config {run_dir / 'config.yaml'}")
    for w in words:
        assert w in line


def test_empty_prompt(capsys):
    line = error_line(capsys, "predict", *RUN, "--data.prompts", '["The Time Traveller", " "]')
    assert line == "error: prompt 2 is empty: give every prompt some text to continue"


def test_prompt_longer_than_the_context_is_cropped_with_a_warning(capsys):
    prompt = "The Time Traveller (for so it will be convenient to speak of him) was expounding a recondite matter"
    with pytest.warns(UserWarning, match=r"prompt 1 has 2\d tokens, more than context_length=8; the model sees only"):
        main(["predict", *RUN, "--data.context_length", "8", "--data.prompts", f'["{prompt}"]',
              "--model.max_new_tokens", "3"])  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith(prompt) and len(out.split("\n")[0]) > len(prompt)  # the whole prompt, then 3 tokens


class PoisonAt(Callback):
    """Turn the output head's weights into NaN before training step ``step`` (as a diverging run would)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            pl_module.model.head.weight.data.fill_(math.nan)


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(capsys, tmp_path):
    poison = '{"class_path": "test_robustness.PoisonAt", "init_args": {"step": 4}}'
    args = ["fit", *RUN, "--trainer.max_epochs", "3", f"--trainer.callbacks+={poison}"]
    line = error_line(capsys, *args, "--trainer.logger.init_args.save_dir", str(tmp_path))
    last = tmp_path / "residual" / "version_0" / "checkpoints" / "last.ckpt"
    assert line == (
        f"error: the training loss is nan at step 4 (epoch 1, batch 1); training stopped before that update "
        f"and the last good checkpoint is {last}. Try a smaller model.lr"
    )
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["epoch"] == 0 and ckpt["global_step"] == 3  # saved after epoch 0, not after the NaN
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())
    assert sorted(p.name for p in last.parent.iterdir()) == ["best-epoch00.ckpt", "last.ckpt"]
