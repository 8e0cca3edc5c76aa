"""Every command of the README's ```bash blocks is run by a test as the README writes it, or is listed in NOT_RUN
with why it cannot run here and which test or CI step covers it.

The ``python -m gpt_lit`` commands run here, each in a process of its own, in the README's order, in one empty
folder (so that ``--ckpt_path last`` finds the run the ``fit`` made): the README's 10-epoch ``fit`` with a shorter
schedule and a tiny model appended (SHORTER), every other one verbatim. Each ends with exit status 0 and prints or
writes what the README says it does, and no warning or other NOISE (tests/test_packaging.py's list). The processes
are forked from one that has imported gpt_lit's CLI (torch and Lightning, seconds each time) and run nothing: each
then runs ``gpt_lit/__main__.py`` as `python -m gpt_lit` does and exits, so that no command sees a filter, warning
registry or other state an earlier one left.
"""

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_packaging import NOISE

README = REPO / "README.md"
FIT = "python -m gpt_lit fit --config residual.yaml"  # the chapter's 10-epoch run
# appended to FIT: one epoch of one training batch and one validation batch of 8 windows, every diagnostic still on,
# on a tiny model (the later commands read it from the run's config.yaml): what the commands print and write is the
# same at any size, and the chapter's model would write and read 350 MB checkpoints (the chapter: test_scripts.py)
SHORTER = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1",
           "--data.eval_batch_size", "8", "--model.config.emb_dim", "32", "--model.config.n_layers", "2",
           "--model.config.n_heads", "2", "--data.context_length", "32"]  # fmt: skip
PROMPTS = ["The Time Traveller", "I saw"]  # the README's predict command's

# The README's commands that no test here runs: why, and what covers them.
NOT_RUN = {
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu":
        "a download from PyTorch's index; .ci/run installs torch==2.13.0 before anything else",
    "pip install torch==2.13.0": ".ci/run's first step",
    "pip install -e .": "an install; tests/test_packaging.py installs gpt_lit from its files with pip, offline",
    'pip install -e ".[dev]"': ".ci/run's second step",
    "tensorboard --logdir lightning_logs --samples_per_plugin images=100":
        "a server that runs until stopped; tests/test_diagnostics.py reads a run's events with TensorBoard's reader",
    "python -m gpt_lit export --ckpt_path last --out exported/": "tests/test_export.py runs it from README.md",
    "python -c \"from transformers import pipeline; print(pipeline('text-generation', model='exported')"
    "('The Time Traveller'))\"": "tests/test_export.py runs it from README.md",
    "bash scripts/run_chapter.sh": "four 10-epoch runs; its fit is FIT, run here shorter, and its last step "
                                   "(scripts/compare_runs.py) is run by tests/test_scripts.py",
    "python scripts/reproduce_chapter.py": "tests/test_scripts.py runs it, with --out a temporary folder",
    'pip install -e ".[hub]"': "an install from the network; tests/test_pretrained.py runs a hub name without it",
    "python -m gpt_lit predict --config gpt2_124m --model.init_from gpt2":
        "downloads GPT-2's weights; tests/test_pretrained.py runs it with the hub out of reach",
    "python -m gpt_lit predict --config gpt2_124m --model.init_from models/gpt2":
        "needs GPT-2's files in models/gpt2; tests/test_pretrained.py runs it on a folder of random 124M weights",
    "python -m gpt_lit fit --config gpt2_124m_finetune":
        "downloads GPT-2's weights and trains 124M parameters; tests/test_pretrained.py checks the config against "
        "GPT-2 124M's and fits from a weights folder",
    "python -m pytest -q": ".ci/run runs it, with the full fault and settings matrices",
    "python -m pytest -q -m smoke": ".ci/lowest runs it on tests/test_smoke.py; the full suite includes it",
}  # fmt: skip


def readme_commands() -> list[tuple[str, str]]:
    """(text, shell line) of each command in the README's ```bash blocks, in order: a line ending with ``\\`` joined
    to the next, a ``# comment`` cut off; the text has each run of spaces as one, the shell line is as written."""
    commands, in_bash, pending = [], False, ""
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_bash = not in_bash and line.strip() == "```bash"
            continue
        if not in_bash:
            continue
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        shell = re.sub(r"(^|\s)#.*$", "", pending).strip()
        pending = ""
        if shell:
            commands.append((" ".join(shell.split()), shell))
    return commands


def test_every_readme_command_is_run_here_or_listed_with_what_covers_it():
    texts = [text for text, _ in readme_commands()]
    assert FIT in texts, "the README's fit, which the other commands read, is not in a bash block"
    neither = [t for t in texts if t not in NOT_RUN and not t.startswith("python -m gpt_lit ")]
    assert not neither, f"README commands that no test runs: run them here or list them in NOT_RUN: {neither}"
    gone = sorted(set(NOT_RUN) - set(texts))
    assert not gone, f"NOT_RUN lists commands the README no longer has: {gone}"


def test_the_readme_stays_short():
    """A newcomer's page from clone to curves; the rest belongs in docs/."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 240


def test_the_readme_says_how_to_get_the_code_without_a_placeholder_address():
    text = README.read_text(encoding="utf-8")
    assert not re.search(r"https?://\S*<[^>]*>", text), "an address with a <placeholder> a reader cannot use"
    assert "Get the code" in text


# Run in one new process: imports gpt_lit's CLI, then forks a process per command (argv[1]: a JSON list of argument
# lists) that runs it as `python -m gpt_lit <args>` would, its stdout and stderr into <i>.out and <i>.err of argv[2];
# stops at the first that fails; the exit status of each into codes.json.
FORKS = """
import gc, json, os, runpy, sys
from pathlib import Path
import gpt_lit.run.cli  # what `python -m gpt_lit` imports, before it runs anything
gc.freeze()  # as gpt_lit/__main__.py does after its imports (and the forks share these pages)

commands, logs = json.loads(sys.argv[1]), Path(sys.argv[2])
codes = []
for i, args in enumerate(commands):
    sys.stdout.flush(); sys.stderr.flush()
    if (pid := os.fork()) == 0:  # the command's process: it ends as `python -m gpt_lit` would, here or in the command
        for fd, kind in ((1, "out"), (2, "err")):
            os.dup2(os.open(logs / f"{i}.{kind}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = [gpt_lit.__file__.replace("__init__.py", "__main__.py"), *args]
        runpy.run_module("gpt_lit", run_name="__main__", alter_sys=True)
        sys.exit(0)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    (logs / "codes.json").write_text(json.dumps(codes))
    if codes[-1] != 0:
        break
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """The README's ``python -m gpt_lit`` commands not in NOT_RUN, run in order in one empty folder until one fails,
    each in a process of its own (FORKS): the folder, and each command's result by its text."""
    folder, logs = tmp_path_factory.mktemp("readme"), tmp_path_factory.mktemp("readme_output")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    texts, commands = [], []
    for text, shell in readme_commands():
        if text in NOT_RUN or not text.startswith("python -m gpt_lit "):
            continue
        python, m, gpt_lit, *args = shlex.split(shell)
        assert [python, m, gpt_lit] == ["python", "-m", "gpt_lit"], shell
        texts.append(text)
        commands.append([*args, *(SHORTER if text == FIT else [])])
    forks = [sys.executable, "-c", FORKS, json.dumps(commands), str(logs)]
    done = subprocess.run(forks, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and not done.stdout + done.stderr, done.stderr[-3000:]
    codes = json.loads((logs / "codes.json").read_text())
    results = {}
    for i, (text, args, code) in enumerate(zip(texts, commands, codes, strict=False)):  # to the first that failed
        out, err = ((logs / f"{i}.{kind}").read_text() for kind in ("out", "err"))
        results[text] = subprocess.CompletedProcess(["python", "-m", "gpt_lit", *args], code, out, err)
    return folder, results


def result(ran, start: str) -> subprocess.CompletedProcess:
    """The result of the README's one command that starts with ``start``."""
    (text,) = [t for t in ran[1] if t.startswith(start)]
    return ran[1][text]


@pytest.mark.full  # a process of its own for each command (docs/testing.md: two tiers)
def test_the_readme_commands_run_in_order_and_succeed(ran):
    texts = [t for t, _ in readme_commands() if t not in NOT_RUN and t.startswith("python -m gpt_lit ")]
    assert list(ran[1]) == texts[: len(ran[1])] and len(texts) >= 4  # fit, test, predict, the resume
    for text, done in ran[1].items():
        assert done.returncode == 0, f"{text}: exit status {done.returncode}\n{done.stderr[-3000:]}"
        said = done.stdout + done.stderr
        assert [word for word in NOISE if word in said] == [], f"{text}:\n{said[-3000:]}"  # the quiet console
    assert list(ran[1]) == texts


@pytest.mark.full
def test_fit_writes_its_config_events_and_checkpoints_into_the_run_folder(ran):
    run = ran[0] / "lightning_logs" / "residual" / "version_0"
    assert (run / "config.yaml").is_file() and list(run.glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best-epoch00.ckpt", "last.ckpt"]


@pytest.mark.full
def test_test_prints_the_loss_and_perplexity_and_logs_them_beside_the_run(ran):
    out = result(ran, "python -m gpt_lit test ").stdout
    loss, perplexity = (float(re.search(rf"{tag}\s*│\s*([\d.]+)", out)[1]) for tag in ("test/loss", "test/perplexity"))
    assert 0 < loss < math.log(50257) + 1 and math.isclose(perplexity, math.exp(loss), rel_tol=1e-3)
    assert list((ran[0] / "lightning_logs/residual/version_0/test/last").glob("events.out.tfevents.*"))


@pytest.mark.full
def test_predict_prints_each_prompts_continuation_and_writes_them_beside_the_run(ran):
    out = result(ran, "python -m gpt_lit predict --ckpt_path last ").stdout
    predict = ran[0] / "lightning_logs/residual/version_0/predict/last"
    written = (predict / "continuations.txt").read_text(encoding="utf-8")
    assert written.startswith(PROMPTS[0]) and f"\n\n{PROMPTS[1]}" in written  # each prompt, then what follows
    assert written in out
    assert not list(predict.rglob("events.out.tfevents.*"))  # nothing for TensorBoard


@pytest.mark.full
def test_predict_with_inspect_writes_a_page_of_each_prompt_beside_the_run(ran):
    out = result(ran, "python -m gpt_lit predict --ckpt_path best ").stdout
    page = Path("lightning_logs/residual/version_0/predict/best-epoch00/inspect_1.html")
    assert f"[prompt 1: its page written to {page}]" in out
    assert "The Time Traveller (for so it will be convenient" in (ran[0] / page).read_text()
    figures = sorted(p.name for p in (ran[0] / page.with_suffix("")).iterdir())
    assert figures == ["attention.png", "lens.png", "loss.png", "stream.png"]


@pytest.mark.full
def test_the_resume_command_goes_on_in_the_same_run_folder(ran):
    result(ran, "python -m gpt_lit fit --config lightning_logs/residual/version_0/config.yaml ")
    assert [p.name for p in (ran[0] / "lightning_logs" / "residual").iterdir()] == ["version_0"]
