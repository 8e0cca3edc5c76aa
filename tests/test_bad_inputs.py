"""A command with a bad input says so in one `error:` line (status 2) before Lightning says a word, reads a
checkpoint or writes anything: the run folder it would have written into is left as it was, byte for byte (no
config.yaml, no event file, no new folder), beside the outputs of the earlier commands that succeeded.

The commands run on a copy of the session's tiny run, where a `predict --ckpt_path last` and a `test --ckpt_path
last` have already written predict/last/ and test/last/, in this process (``main``), where Lightning's lines are log
records. The bad input that needs two processes (fewer prompts than processes) is a step of tests/test_ddp.py's.
"""

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from gpt_lit import book_source
from gpt_lit.run.cli import main

PREDICT = ["predict", "--ckpt_path", "last"]
TEST = ["test", "--ckpt_path", "last", "--trainer.limit_test_batches", "1"]


@pytest.fixture(scope="module")
def runs(tiny_run, tmp_path_factory) -> Path:
    """A folder holding a copy of the tiny run's lightning_logs/, with a successful predict and test beside the run."""
    root = tmp_path_factory.mktemp("bad_inputs")
    shutil.copytree(tiny_run.root / "lightning_logs", root / "lightning_logs")
    before = os.getcwd()
    os.chdir(root)
    try:
        main([*PREDICT, "--data.prompts", '["The Time Traveller"]', "--model.max_new_tokens", "3"])
        main(TEST)
    finally:
        os.chdir(before)
    run = root / "lightning_logs" / "residual" / "version_0"
    assert {p.name for p in (run / "predict" / "last").iterdir()} == {"config.yaml", "continuations.txt"}
    assert any((run / "test" / "last").glob("events.out.tfevents.*"))
    return root


def everything(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every file under ``root`` with its bytes and modification time, every folder (None)."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
        for p in root.rglob("*")
    }


def fails_alone(runs: Path, monkeypatch, caplog, capsys, *args: str) -> tuple[str, list[str]]:
    """Run `python -m gpt_lit <args>` in ``runs``; check it exits with status 2 and one `error:` line, no traceback,
    and leaves every file and folder as it was. Its error line, and what Lightning said before it."""
    monkeypatch.chdir(runs)
    before = everything(runs)
    capsys.readouterr()
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as exit_:
        main(list(args))
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert everything(runs) == before
    return errors[0], [r.getMessage() for r in caplog.records if r.name.startswith("lightning.pytorch")]


NO_PROMPT = "error: data.prompts_file {file} holds no prompt (no line with text); write one prompt a line"


@pytest.mark.parametrize(
    "prompts, file, expected",
    [
        (None, b"", NO_PROMPT),
        (None, b"\n  \r\n", NO_PROMPT),
        (None, b"\xffThe Time", "error: data.prompts_file {file} is not UTF-8 text (byte 0); save it as UTF-8"),
        (None, None, "error: cannot read data.prompts_file {file} (Is a directory); give a text file with one "
                     "prompt a line"),
        (None, "missing", "error: cannot read data.prompts_file {file} (No such file or directory); give a text "
                          "file with one prompt a line"),
        ([], None, "error: predict needs prompts: set data.prompts in the config or data.prompts_file"),
        (["The Time", " "], None, "error: prompt 2 is empty: give every prompt some text to continue"),
    ],
    ids=["empty file", "blank lines", "not UTF-8", "a folder", "missing", "no prompts", "an empty prompt"],
)  # fmt: skip
def test_bad_prompts_are_found_before_lightning_says_a_word(runs, tmp_path, monkeypatch, caplog, capsys, prompts, file,
                                                            expected):  # fmt: skip
    path = tmp_path / "prompts.txt"
    if file is None:
        path.mkdir()
    elif file != "missing":
        path.write_bytes(file)
    given = ["--data.prompts", json.dumps(prompts)] if prompts is not None else ["--data.prompts_file", str(path)]
    line, lightning_said = fails_alone(runs, monkeypatch, caplog, capsys, *PREDICT, *given)
    assert line == expected.format(file=path)
    assert lightning_said == []


def test_a_book_that_is_not_there_stops_test_before_it_writes(runs, tmp_path, monkeypatch, caplog, capsys):
    line, lightning_said = fails_alone(
        runs, monkeypatch, caplog, capsys, *TEST, "--data.data_dir", str(tmp_path), "--data.download", "false"
    )
    assert line.startswith(f"error: The Time Machine is not at {tmp_path / 'pg35.txt'} and downloading is switched off")
    assert lightning_said == []  # the Trainer not even built


def test_a_book_that_cannot_be_downloaded_stops_test_before_it_writes(runs, tmp_path, monkeypatch, caplog, capsys):
    # Found as the Trainer runs (prepare_data downloads it): the test/last/ folder gets no event file all the same.
    monkeypatch.setattr(book_source, "BOOK_URL", "http://127.0.0.1:9/pg35.txt")  # nothing listens there
    line, _ = fails_alone(runs, monkeypatch, caplog, capsys, *TEST, "--data.data_dir", str(tmp_path))
    assert line.startswith(f"error: The Time Machine is not at {tmp_path / 'pg35.txt'} and downloading ")


@pytest.mark.parametrize(
    "args, expected",
    [
        ([*TEST, "--data.train_fraction", "0.99999"], "its validation part has 2 tokens, too few for one window"),
        (["validate", "--ckpt_path", "last", "--data.train_fraction", "0.00001"], "its training part has 1 tokens"),
    ],
    ids=["test", "validate"],
)
def test_a_book_too_short_for_a_window_stops_the_command_before_it_writes(runs, monkeypatch, caplog, capsys, args,
                                                                          expected):  # fmt: skip
    line, lightning_said = fails_alone(runs, monkeypatch, caplog, capsys, *args)  # validate: no new version_1
    assert expected in line
    assert lightning_said == []


def test_a_batch_larger_than_the_book_makes_no_new_run(runs, monkeypatch, caplog, capsys):
    config = str(Path("lightning_logs", "residual", "version_0", "config.yaml"))
    line, _ = fails_alone(runs, monkeypatch, caplog, capsys, "fit", "--config", config, "--data.batch_size", "1000")
    assert line.endswith(
        "317 training windows make no full batch of data.batch_size=1000; use data.batch_size 317 or less"
    )


@pytest.mark.parametrize("command", [["fit", "--config", "residual.yaml"], TEST], ids=["fit", "test"])
def test_inspect_is_refused_outside_predict(runs, monkeypatch, caplog, capsys, command):
    line, lightning_said = fails_alone(runs, monkeypatch, caplog, capsys, *command, "--model.inspect", "true")
    assert line == f"error: model.inspect is for predict (a page for each prompt), not {command[0]}: leave it out"
    assert lightning_said == []


def test_inspect_refuses_an_empty_prompt_and_another_architecture(runs, monkeypatch, caplog, capsys):
    inspect = [*PREDICT, "--model.inspect", "true"]
    line, _ = fails_alone(runs, monkeypatch, caplog, capsys, *inspect, "--data.prompts", '["The Time", ""]')
    assert line == "error: prompt 2 is empty: give every prompt some text to continue"
    line, _ = fails_alone(runs, monkeypatch, caplog, capsys, *inspect, "--data.prompts", '["I saw"]',
                          "--model.config.residual", "false")  # fmt: skip
    run = Path("lightning_logs/residual/version_0")
    assert line == (f"error: checkpoint {run / 'checkpoints' / 'last.ckpt'} is of a different architecture than the "
                    "config: model.config.residual is True in the checkpoint but False here; use the run's own config: "
                    f"--config {run / 'config.yaml'}")  # fmt: skip
