"""`python -m gpt_lit` as a reader uses it: every shipped config builds, by name from anywhere; fit, then test and
predict beside the run."""

import hashlib
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, TINY, scalars

from gpt_lit.data import TimeMachineData
from gpt_lit.model import count_params
from gpt_lit.module import GPTLightning
from gpt_lit.run.cli import GPTLitCLI, main

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def build(args: list[str]) -> GPTLitCLI:
    """The CLI of ``args``, built but not run; the model's tensors on the meta device (shapes only: no memory, no
    random initialisation of 124M parameters)."""
    with torch.device("meta"):
        return GPTLitCLI(GPTLightning, TimeMachineData, args=args, run=False)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """`python -m gpt_lit <args>` in this process: (exit status, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_configs_are_shipped():
    names = {c.stem for c in CONFIGS}
    assert {"residual", "no_residual", "residual_8", "no_residual_8", "gpt2_124m"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_builds(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # loggers and checkpoints would go here
    cli = build(["--config", str(config)])
    cfg, text = cli.model.model.cfg, config.read_text()
    # the links: the model's position table and vocabulary come from the data
    assert cfg.context_length == cli.datamodule.context_length and cfg.vocab_size == 50257
    # commented: a header that says what the config is and how to run it, before the first setting
    header = text[: re.search(r"^\w+:", text, re.MULTILINE).start()].splitlines()
    assert len([line for line in header if line.startswith("# ")]) >= 3, config.stem
    assert "python -m gpt_lit" in "\n".join(header), config.stem
    if config.stem.startswith("gpt2_124m"):  # GPT-2 124M, tied; the fine-tune keeps 256 of its 1024 positions
        assert count_params(cli.model.model) == 124_439_808 - (1024 - cfg.context_length) * 768
        return
    depth = 8 if config.stem.endswith("_8") else 4
    assert (cfg.n_layers, cfg.emb_dim, cfg.n_heads, cfg.context_length, cfg.dropout) == (depth, 256, 4, 128, 0.1)
    assert cfg.residual == (not config.stem.startswith("no_"))
    assert cli.trainer.max_epochs == 10 and cli.datamodule.batch_size == 16
    assert cli.config["seed_everything"] == 123
    assert Path(cli.trainer.logger.log_dir).parent.name == config.stem  # lightning_logs/<run name>/version_N


@pytest.mark.parametrize("name", ["residual.yaml", "residual", "configs/residual.yaml", "no_residual_8"])
def test_a_shipped_config_by_name_from_any_folder(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    cli = build(["--config", name])
    stem = Path(name).name.removesuffix(".yaml")
    assert cli.model.model.cfg.n_layers == (8 if stem.endswith("_8") else 4)
    assert cli.model.model.cfg.residual == (not stem.startswith("no_"))
    assert Path(cli.trainer.logger.log_dir).parent.name == stem


def test_a_path_that_exists_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = (REPO / "configs/residual.yaml").read_text()
    Path("residual.yaml").write_text(text.replace("max_epochs: 10", "max_epochs: 3"))
    for value in ("residual.yaml", "--config=residual.yaml"):
        args = [value] if value.startswith("--") else ["--config", value]
        assert build(args).trainer.max_epochs == 3
    assert build(["-c", "residual"]).trainer.max_epochs == 10


def test_an_unknown_config_name_lists_the_shipped_ones(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", "resid.yaml"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert err.startswith("error: --config resid.yaml: no such file, and no shipped config of that name;")
    shipped = sorted(path.stem for path in (REPO / "configs").glob("*.yaml"))  # what a reader sees in configs/
    assert f"the shipped configs are {', '.join(shipped)} (" in err


def test_help_explains_every_option(capsys):
    code, out, _ = run_main(capsys, "fit", "--help")
    assert code == 0
    assert out.startswith("usage: python -m gpt_lit [options] fit")
    shipped = ", ".join(sorted(path.stem for path in (REPO / "configs").glob("*.yaml")))
    assert f"the name of a shipped config ({shipped};" in " ".join(out.split())
    for option, words in {
        "--model.config.emb_dim": "Width of every token vector",
        "--model.config.residual": "Residual connections",
        "--model.lr": "AdamW learning rate",
        "--data.data_dir": "GPT_LIT_DATA_DIR",
        "--data.context_length": "Tokens per training window",
    }.items():
        assert option in out and words in out, option
    assert "data.context_length --> model.config.context_length" in out


def test_help_without_a_subcommand_lists_all_five_and_a_subcommand_builds_only_its_own(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0 and "{fit,validate,test,predict,export}" in out
    code, _, err = run_main(capsys, "fitt")  # a misspelt subcommand: the choices are all five
    assert code == 2 and "(choose from 'fit', 'validate', 'test', 'predict', 'export')" in err
    code, out, _ = run_main(capsys, "export", "--help")
    assert code == 0 and out.startswith("usage: python -m gpt_lit [options] export")
    assert list(GPTLitCLI.subcommands(SimpleNamespace(command_line=("export", "--help")))) == ["export"]


def fingerprint(run: Path) -> dict[str, str]:
    """sha256 of every file of a run folder (its config, events and checkpoints), not its validate/test/predict
    outputs."""
    outputs = ("validate", "test", "predict")
    files = [p for p in run.rglob("*") if p.is_file() and p.relative_to(run).parts[0] not in outputs]
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_fit_then_test_and_predict_beside_the_run(tiny_run, capsys, monkeypatch):
    version = tiny_run.version  # `fit` of residual.yaml, 2 epochs of 3 steps, started in tiny_run.root
    monkeypatch.chdir(tiny_run.root)
    ckpts = sorted(p.name for p in (version / "checkpoints").iterdir())
    assert ckpts == ["best-epoch01.ckpt", "last.ckpt"]
    # The last epoch is the best: the shipped config saves its file after the epoch's end, as last.ckpt, so the
    # two are the same state.
    best, state = (torch.load(version / "checkpoints" / name, map_location="cpu", weights_only=False) for name in ckpts)
    assert state["epoch"] == 1 and state["global_step"] == 6
    assert best["state_dict"].keys() == state["state_dict"].keys()
    assert all(best["state_dict"][k].equal(v) for k, v in state["state_dict"].items())
    assert (version / "config.yaml").is_file()
    files = fingerprint(version)
    [(_, first_val), (_, last_val)] = scalars(version)["loss/val"]
    assert last_val == pytest.approx(tiny_run.last_val)
    assert first_val - last_val > 0.05  # so the weights of epoch 1 are told apart from epoch 0's and untrained ones

    def test_loss(*args: str) -> float:
        code, out, err = run_main(capsys, "test", *args)
        assert code == 0, err[-3000:]
        loss = float(re.search(r"test/loss\s*[│|]\s*([\d.]+)", out).group(1))  # the table a reader sees
        ppl = float(re.search(r"test/perplexity\s*[│|]\s*([\d.]+)", out).group(1))
        assert abs(ppl - torch.tensor(loss).exp().item()) / ppl < 1e-3
        return loss

    # A checkpoint of the run, by path: the test loss goes into <run>/test/<checkpoint name>/.
    ckpt = str(version / "checkpoints" / "best-epoch01.ckpt")
    loss = test_loss("--config", str(version / "config.yaml"), "--ckpt_path", ckpt)
    assert loss == pytest.approx(last_val, abs=1e-4)  # the trained weights: the run's last validation loss
    assert scalars(version / "test" / "best-epoch01")["test/loss"][-1][1] == pytest.approx(loss, abs=1e-3)

    # --ckpt_path last: the latest run of the config's name, into <run>/test/last/.
    loss = test_loss(*tiny_run.args, "--ckpt_path", "last")
    assert loss == pytest.approx(last_val, abs=1e-4)  # not an untrained model's
    assert scalars(version / "test" / "last")["test/loss"][-1][1] == pytest.approx(loss, abs=1e-3)

    code, out, err = run_main(
        capsys, "predict", "--config", str(version / "config.yaml"), "--ckpt_path", str(version / "checkpoints" /
        "last.ckpt"), "--data.prompts", '["The Time Traveller", "It was"]', "--model.max_new_tokens", "5",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    written = version / "predict" / "last" / "continuations.txt"
    text = written.read_text()  # each continuation after its prompt, in the prompts' order
    second = text.index("It was")
    assert text.startswith("The Time Traveller") and second > len("The Time Traveller")
    assert text[:second].strip() in out and text[second:].strip() in out  # and printed

    assert [p.name for p in version.parent.iterdir()] == ["version_0"]  # no new run folders
    assert fingerprint(version) == files  # nothing of the run was touched


def test_ckpt_path_last_without_a_run_says_where_it_looked(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["test", "--config", "residual", *TINY, "--ckpt_path", "last"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("error:") == 1, err
    assert err.startswith(
        f"error: --ckpt_path last: no run in lightning_logs/residual (from {tmp_path}). Train one with "
        f"`python -m gpt_lit fit` and the same config, or give a checkpoint's path"
    )


def test_prompts_from_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.txt").write_text("The Time Traveller\n\nAttention is\n")
    args = ["predict", "--config", str(REPO / "configs/gpt2_124m.yaml"), "--data.prompts", "[]"]
    code, out, err = run_main(
        capsys, *args, "--data.prompts_file", "prompts.txt", "--model.config.tie_weights", "false"
    )
    assert code == 0, err[-3000:]
    # seed 123, untied GPTConfig(): the chapter's gibberish, from the CLI, in the file's order, the blank line skipped
    first = out.index("The Time Traveller preventionの� Const preventionの� needy Chris IV DOJanton Richard doubt")
    second = out.index("Attention is retrospective programmer programmer programmer programmerLinkedIn")
    assert first < second


def test_no_bar_no_summary_or_the_configs_own_bar(tmp_path, capsys, caplog, monkeypatch):
    """``--trainer.enable_progress_bar false`` and ``--trainer.enable_model_summary false`` print neither; a bar the
    config lists is the bar, as given (Lightning's ``v_num`` and all), beside the quiet summary."""
    monkeypatch.chdir(tmp_path)
    steps = [*TINY, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"]
    steps += ["--trainer.limit_val_batches", "1", "--trainer.num_sanity_val_steps", "0", "--data.eval_train", "false"]
    off = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    code, out, err = run_main(capsys, "fit", *steps, *off)
    assert code == 0 and "Epoch 0" not in out + err and "Trainable params" not in out + err, out + err

    config = tmp_path / "tqdm.yaml"
    config.write_text("trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.TQDMProgressBar\n")
    code, out, err = run_main(capsys, "fit", "--config", str(config), *steps)
    assert code == 0 and "Trainable params" in out and "FLOPs" not in out, out + err
    bars = [line for line in out.split("\r") if line.startswith("Epoch 0: 100%")]  # Lightning's tqdm bar: stdout
    assert bars and "v_num=1" in bars[-1], out  # the second run: version_1
    assert "already configured" not in caplog.text  # Lightning's note that it makes no summary of its own


def test_the_cli_class_takes_its_arguments_as_a_dict_as_lightningcli_does(tmp_path):
    """``GPTLitCLI(..., args=<dict>)`` (a notebook's way, LightningCLI's ``parse_object``) builds what the dict says."""
    args = {"model": {"lr": 0.001, "config": {"emb_dim": 32, "n_layers": 1, "n_heads": 2}},
            "data": {"context_length": 32}, "trainer": {"accelerator": "cpu", "logger": False,
                                                        "default_root_dir": str(tmp_path)}}  # fmt: skip
    cli = GPTLitCLI(GPTLightning, TimeMachineData, run=False, args=args)
    assert cli.model.hparams.lr == 0.001 and cli.model.model.cfg.emb_dim == 32
    assert cli.model.model.cfg.context_length == 32  # linked from the data, as from the command line
