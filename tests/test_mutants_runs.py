"""Run folders without a training run: which folder a checkpoint's run is, where test and predict write (predict
outside a run: the next run's folder), a resumed run's loggers, ``--ckpt_path`` without ``--config``, the best
checkpoint a last.ckpt names.
Folders and checkpoints made here by hand; in milliseconds, so that mutation testing (docs/testing.md) runs these for
every mutant of gpt_lit/run/folders.py."""

from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace

from gpt_lit.errors import GptLitError
from gpt_lit.run.folders import (
    best_of,
    checkpoints_dirpath,
    continue_run,
    log_beside_run,
    newest_config_runs,
    run_config,
    run_of,
)


def make_run(folder: Path, *, config: bool = True, events: bool = False, ckpt: str = "last.ckpt") -> Path:
    """A run folder as fit leaves it: checkpoints/<ckpt>, and config.yaml and/or an event file."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / ckpt).write_bytes(b"x")
    if config:
        (folder / "config.yaml").write_text("seed_everything: 1\n")
    if events:
        (folder / "events.out.tfevents.1.host").write_bytes(b"")
    return folder / "checkpoints" / ckpt


def logger(save_dir, name="tiny", version=None, kind="TensorBoardLogger") -> Namespace:
    init = Namespace(save_dir=str(save_dir), name=name, version=version)
    return Namespace(class_path=f"lightning.pytorch.loggers.{kind}", init_args=init)


def test_a_checkpoints_run_is_the_folder_above_checkpoints_with_a_config_or_events(tmp_path):
    assert run_of(str(make_run(tmp_path / "a"))) == tmp_path / "a"
    assert run_of(str(make_run(tmp_path / "b", config=False, events=True))) == tmp_path / "b"
    assert run_of(str(make_run(tmp_path / "c", config=False))) is None  # neither: not a run
    (tmp_path / "d" / "weights").mkdir(parents=True)
    (tmp_path / "d" / "config.yaml").write_text("")
    assert run_of(str(tmp_path / "d" / "weights" / "x.ckpt")) is None  # not in checkpoints/
    for name in (None, "", "last", "best", "hpc", "registry", f"s3:/{tmp_path}/a/checkpoints/last.ckpt"):
        assert run_of(name) is None, name


def test_predict_outside_a_run_writes_into_the_loggers_version_or_the_next_number(tmp_path):
    for version in ("version_0", "version_7", "version_x", "other"):
        (tmp_path / "tiny" / version).mkdir(parents=True)

    def written(trainer: Namespace) -> str | None:  # where predict writes, logging nothing
        log_beside_run(Namespace(ckpt_path=None, trainer=trainer), "predict", None, None)
        assert trainer.logger is False
        return trainer.get("default_root_dir")

    assert written(Namespace(logger=logger(tmp_path))) == str(tmp_path / "tiny" / "version_8")
    assert written(Namespace(logger=logger(tmp_path, name="new"))) == str(tmp_path / "new" / "version_0")
    assert written(Namespace(logger=logger(tmp_path, version=3))) == str(tmp_path / "tiny" / "version_3")
    assert written(Namespace(logger=logger(tmp_path, version="mine"))) == str(tmp_path / "tiny" / "mine")
    (tmp_path / "lightning_logs" / "version_1").mkdir(parents=True)
    default = Namespace(logger=True, default_root_dir=str(tmp_path))
    assert written(default) == str(tmp_path / "lightning_logs" / "version_2")
    wandb = Namespace(class_path="x.WandbLogger", init_args=Namespace(project="p"))
    assert written(Namespace(logger=wandb, default_root_dir="kept")) == "kept"  # no run folder: where it was


def test_last_ckpt_is_looked_for_beside_the_model_checkpoint_with_a_monitor(tmp_path):
    def checkpoint(dirpath=None, monitor=None) -> Namespace:
        init = Namespace(dirpath=dirpath, monitor=monitor)
        return Namespace(class_path="lightning.pytorch.callbacks.ModelCheckpoint", init_args=init)

    every = checkpoint(str(tmp_path / "every"))
    assert checkpoints_dirpath(Namespace(callbacks=[every])) == tmp_path / "every"
    assert checkpoints_dirpath(Namespace(callbacks=[every, checkpoint(monitor="loss/val")])) is None  # the run's
    best = checkpoint(str(tmp_path / "best"), "loss/val")
    assert checkpoints_dirpath(Namespace(callbacks=[every, best])) == tmp_path / "best"
    assert checkpoints_dirpath(Namespace(callbacks=best)) == tmp_path / "best"  # one, not a list
    assert checkpoints_dirpath(Namespace(callbacks=None)) is None


def test_test_logs_into_the_run_and_predict_writes_beside_it(tmp_path):
    ckpt = make_run(tmp_path / "tiny" / "version_3", ckpt="best-epoch01.ckpt")
    config = Namespace(ckpt_path=str(ckpt), trainer=Namespace(logger=logger(tmp_path)))
    log_beside_run(config, "test", config.ckpt_path, run_of(config.ckpt_path))
    assert config.trainer.logger.init_args == Namespace(
        save_dir=str(tmp_path / "tiny" / "version_3"), name="test", version="best-epoch01"
    )
    config = Namespace(ckpt_path=str(ckpt), trainer=Namespace(logger=logger(tmp_path), default_root_dir=None))
    log_beside_run(config, "predict", config.ckpt_path, run_of(config.ckpt_path))
    assert config.trainer.logger is False
    assert config.trainer.default_root_dir == str(tmp_path / "tiny" / "version_3" / "predict" / "best-epoch01")


def test_outside_a_run_test_logs_as_configured_and_predict_writes_into_the_next_run(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "tiny" / "version_0").mkdir(parents=True)
    config = Namespace(ckpt_path=str(tmp_path / "elsewhere" / "x.ckpt"), trainer=Namespace(logger=logger(tmp_path)))
    log_beside_run(config, "test", config.ckpt_path, run_of(config.ckpt_path))
    assert config.trainer.logger == logger(tmp_path)
    config = Namespace(ckpt_path=None, trainer=Namespace(logger=logger(tmp_path), default_root_dir=None))
    log_beside_run(config, "predict", config.ckpt_path, run_of(config.ckpt_path))
    assert config.trainer.logger is False and config.trainer.default_root_dir == str(tmp_path / "tiny" / "version_1")
    wandb = Namespace(class_path="x.WandbLogger", init_args=Namespace(project="p"))
    config = Namespace(ckpt_path=None, trainer=Namespace(logger=wandb, default_root_dir="kept"))
    log_beside_run(config, "predict", config.ckpt_path, run_of(config.ckpt_path))
    assert config.trainer.default_root_dir == "kept"
    ckpt = make_run(tmp_path / "tiny" / "version_2")
    config = Namespace(ckpt_path=str(ckpt), trainer=Namespace(logger=wandb))
    # a logger without a save_dir logs where it logs
    log_beside_run(config, "test", config.ckpt_path, run_of(config.ckpt_path))
    assert config.trainer.logger == Namespace(class_path="x.WandbLogger", init_args=Namespace(project="p"))


def test_a_resumed_runs_loggers_all_go_on_in_its_folder(tmp_path):
    ckpt = make_run(tmp_path / "tiny" / "version_2")
    loggers = [logger(tmp_path), logger(tmp_path, kind="CSVLogger"), logger(tmp_path, version="set")]
    config = Namespace(ckpt_path=str(ckpt), trainer=Namespace(logger=loggers))
    continue_run(config, run_of(config.ckpt_path))
    assert [each.init_args.version for each in config.trainer.logger] == [2, 2, "set"]
    named = make_run(tmp_path / "tiny" / "mine")
    config = Namespace(ckpt_path=str(named), trainer=Namespace(logger=[logger(tmp_path), logger(tmp_path)]))
    continue_run(config, run_of(config.ckpt_path))
    assert [each.init_args.version for each in config.trainer.logger] == ["mine", "mine"]
    for other in (
        Namespace(ckpt_path=str(ckpt), trainer=Namespace(logger=[logger(tmp_path, name="another")])),  # not its runs
        Namespace(ckpt_path=str(ckpt), trainer=Namespace(logger=logger(tmp_path))),  # one logger: the command line's
        Namespace(ckpt_path="last", trainer=Namespace(logger=[logger(tmp_path)])),
    ):
        before = other.clone()
        continue_run(other, run_of(other.ckpt_path))
        assert other == before


def test_the_runs_of_one_config_without_config_and_the_messages_when_ambiguous(tmp_path):
    base = tmp_path / "lightning_logs"
    with pytest.raises(GptLitError) as error:
        newest_config_runs(base, "last")
    assert str(error.value) == (
        f"--ckpt_path last: no run in {base} (from {Path.cwd()}). Train one with `python -m gpt_lit fit`, or give "
        f"--config (the config whose runs to use) or a checkpoint's path"
    )
    (base / "version_0").mkdir(parents=True)
    assert newest_config_runs(base, "last") == base
    (base / "version_0").rmdir()
    (base / "residual" / "version_0").mkdir(parents=True)
    (base / "residual" / "version_1").mkdir()
    (base / "notes.txt").write_text("")
    (base / "version_9.txt").write_text("")  # a file, not a run
    assert newest_config_runs(base, "best") == base / "residual"
    (base / "plain" / "version_0").mkdir(parents=True)
    (base / "version_3").mkdir()
    with pytest.raises(GptLitError) as error:
        newest_config_runs(base, "best")
    assert str(error.value) == (
        f"--ckpt_path best without --config: {base} holds the runs of 3 configs (plain, residual, and unnamed ones); "
        f"say whose with --config (e.g. --config plain) or give a checkpoint's path"
    )


def given(ckpt_path: object = None, config: object = None, root: object = None, trust: bool = False) -> Namespace:
    """The parsed options of a subcommand, as the parser hands them to ``run_config``."""
    trainer = Namespace(default_root_dir=root)
    return Namespace(ckpt_path=ckpt_path, config=config, trainer=trainer, trust_checkpoint=trust)


def test_a_checkpoint_in_a_run_brings_the_runs_config(tmp_path, monkeypatch):
    ckpt = make_run(tmp_path / "lightning_logs" / "tiny" / "version_0")
    config = str(tmp_path / "lightning_logs" / "tiny" / "version_0" / "config.yaml")
    assert run_config("test", given(str(ckpt))) == (config, str(ckpt))
    assert run_config("export", given(str(ckpt))) == (config, str(ckpt))
    for subcommand, options in (
        ("fit", given(str(ckpt))), ("test", given(str(ckpt), config=["a.yaml"])), ("predict", given()),
        ("test", given(str(tmp_path / "x.ckpt"))), (None, given(str(ckpt))),
    ):  # fmt: skip
        assert run_config(subcommand, options) is None, (subcommand, options)
    newer = make_run(tmp_path / "lightning_logs" / "tiny" / "version_1")
    monkeypatch.chdir(tmp_path)
    assert run_config("validate", given("last")) == (
        str(Path("lightning_logs/tiny/version_1/config.yaml")),
        str(Path("lightning_logs/tiny/version_1/checkpoints/last.ckpt")),
    )
    assert run_config("predict", given("last", root=str(tmp_path)))[0] == str(newer.parent.parent / "config.yaml")
    (newer.parent.parent / "config.yaml").unlink()
    with pytest.raises(GptLitError) as error:
        run_config("test", given("last"))
    last = Path("lightning_logs/tiny/version_1/checkpoints/last.ckpt")
    assert str(error.value) == f"--ckpt_path last: the run of {last} has no config.yaml; add --config"


def save_last(folder: Path, callbacks: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "callbacks": callbacks}, folder / "last.ckpt")
    return folder / "last.ckpt"


def checkpoint_state(best: str, monitor: str | None = "loss/val") -> dict:
    return {"monitor": monitor, "best_model_path": best, "dirpath": "/elsewhere"}


def test_the_best_checkpoint_is_the_one_last_names_found_beside_it(tmp_path):
    run, folder = tmp_path / "run", tmp_path / "run" / "checkpoints"
    last = save_last(folder, {
        "ModelCheckpoint{'monitor': 'loss/val'}": checkpoint_state("/moved/best-epoch03.ckpt"),
        "ModelCheckpoint{'monitor': None}": checkpoint_state("/moved/epoch=4.ckpt", monitor=None),
        "LastCheckpoint": {"saved": 1},
    })  # fmt: skip
    (folder / "best-epoch03.ckpt").write_bytes(b"x")
    (folder / "epoch=4.ckpt").write_bytes(b"x")
    assert best_of(last, run, False) == str(folder / "best-epoch03.ckpt")
    (folder / "best-epoch03.ckpt").unlink()
    with pytest.raises(GptLitError) as gone:
        best_of(last, run, False)
    assert str(gone.value) == (
        f"--ckpt_path best: the newest run, {run}, keeps no best checkpoint (its config has no ModelCheckpoint with a "
        f"monitor, or the file is gone); use --ckpt_path last or a checkpoint's path"
    )
    for callbacks in ({}, {"ModelCheckpoint{'monitor': 'loss/val'}": checkpoint_state("")}):
        with pytest.raises(GptLitError, match="keeps no best checkpoint"):
            best_of(save_last(folder, callbacks), run, False)


def test_two_monitors_each_with_its_best_are_named(tmp_path):
    run = tmp_path / "run"
    last = save_last(run / "checkpoints", {
        "ModelCheckpoint{'monitor': 'loss/val'}": checkpoint_state("/r/a.ckpt"),
        "ModelCheckpoint{'monitor': 'loss/train'}": checkpoint_state(""),
    })  # fmt: skip
    with pytest.raises(GptLitError) as error:
        best_of(last, run, False)
    assert str(error.value) == (
        f"--ckpt_path best: the newest run, {run}, has 2 ModelCheckpoints with a monitor, each with its own best "
        f"(ModelCheckpoint{{'monitor': 'loss/val'}}: /r/a.ckpt; ModelCheckpoint{{'monitor': 'loss/train'}}: none yet); "
        f"give the one you want as --ckpt_path <its path>"
    )


class Opaque:
    """An object a checkpoint holds that only a trusted load reads (a pickled class, not data)."""


def test_a_url_is_never_a_local_run_and_the_default_logger_is_left_alone(tmp_path, monkeypatch):
    make_run(tmp_path / "s3:" / "bucket")  # what "s3://bucket/checkpoints/last.ckpt" would be as a local path
    monkeypatch.chdir(tmp_path)
    assert run_of("s3://bucket/checkpoints/last.ckpt") is None
    ckpt = make_run(tmp_path / "lightning_logs" / "version_0")
    config = Namespace(ckpt_path=str(ckpt), trainer=Namespace(logger=True))
    log_beside_run(config, "test", config.ckpt_path, run_of(config.ckpt_path))
    assert config.trainer.logger is True
    config = Namespace(ckpt_path=str(ckpt), trainer=Namespace(logger=[logger(tmp_path, name="lightning_logs")] * 2))
    continue_run(config, run_of(config.ckpt_path))
    assert [each.init_args.version for each in config.trainer.logger] == [0, 0]  # version_0 is version 0


def test_two_named_configs_are_ambiguous_without_unnamed_ones(tmp_path):
    base = tmp_path / "lightning_logs"
    for name in ("plain", "residual"):
        (base / name / "version_0").mkdir(parents=True)
    with pytest.raises(GptLitError) as error:
        newest_config_runs(base, "last")
    assert "holds the runs of 2 configs (plain, residual); say whose" in str(error.value)


def test_best_and_a_trusted_checkpoint_without_config(tmp_path, monkeypatch):
    run = tmp_path / "lightning_logs" / "version_0"
    make_run(run)
    (run / "checkpoints" / "best-epoch01.ckpt").write_bytes(b"x")
    torch.save({"state_dict": {}, "opaque": Opaque(), "callbacks": {
        "ModelCheckpoint{'monitor': 'loss/val'}": checkpoint_state("/r/best-epoch01.ckpt")}},
        run / "checkpoints" / "last.ckpt")  # fmt: skip
    best = str(run / "checkpoints" / "best-epoch01.ckpt")
    assert best_of(run / "checkpoints" / "last.ckpt", run, True) == best
    with pytest.raises(GptLitError):
        best_of(run / "checkpoints" / "last.ckpt", run, False)  # not data: refused without trust
    monkeypatch.chdir(tmp_path)
    assert run_config("test", given("best", trust=True)) == (
        "lightning_logs/version_0/config.yaml",
        "lightning_logs/version_0/checkpoints/best-epoch01.ckpt",
    )
    with pytest.raises(GptLitError):
        run_config("test", given("best"))
    with pytest.raises(GptLitError, match=r"^--ckpt_path last: no run in "):
        run_config("test", given("last", root=str(tmp_path / "empty"), trust=True))
    torch.save({"state_dict": {}}, run / "checkpoints" / "last.ckpt")  # no callbacks saved at all
    with pytest.raises(GptLitError, match="keeps no best checkpoint"):
        best_of(run / "checkpoints" / "last.ckpt", run, False)
