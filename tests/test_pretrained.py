"""GPT-2's released weights in the chapter's GPT (`model.init_from`), checked against Hugging Face's GPT-2.

Nothing downloads. The "released weights" are a random `transformers.GPT2LMHeadModel`, saved the ways GPT-2's
files come: `save_pretrained`'s safetensors (`transformer.` prefix, no mask buffers), a `pytorch_model.bin` of
the same tensors, and the hub files' layout (no prefix, each block's `attn.bias` / `attn.masked_bias` masks).
Loaded with `init_from`, the chapter's classes must compute Hugging Face's logits, and `fit` must start from
exactly those weights. The hub itself is tested unreachable and uninstalled: its error lines.
"""

import json
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO
from lightning.pytorch.callbacks import Callback
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

from gpt_lit import module
from gpt_lit.errors import GptLitError
from gpt_lit.hub.pretrained import check_config, load_pretrained, read_config
from gpt_lit.model import GPT, GPTConfig, count_params
from gpt_lit.run.cli import GPTLitCLI, main
from gpt_lit.tokenizer import get_tokenizer

SMALL = {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}  # GPT-2's vocabulary, a tiny body
# The chapter's GPT of the same size: what --model.config.* must say for SMALL's weights
SMALL_ARGS = [
    "--model.config.emb_dim", "32", "--model.config.n_layers", "2", "--model.config.n_heads", "2",
    "--model.config.tie_weights", "true",
]  # fmt: skip


def hf_gpt2(**sizes) -> GPT2LMHeadModel:
    """A random Hugging Face GPT-2 (its own initialisation), without dropout, in eval mode."""
    torch.manual_seed(0)
    config = GPT2Config(**sizes, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


def save(hf: GPT2LMHeadModel, folder: Path, layout: str) -> Path:
    """``hf`` written into ``folder`` as one of the three layouts GPT-2's files come in."""
    if layout == "save_pretrained":
        hf.save_pretrained(folder)  # model.safetensors: transformer.h.0..., no buffers, lm_head left out (tied)
        return folder
    hf.config.save_pretrained(folder)
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied: wte is the head
    if layout == "bin":  # what save_pretrained(safe_serialization=False) wrote
        torch.save(state, folder / "pytorch_model.bin")
        return folder
    assert layout == "hub"  # the released files: no prefix, each block's causal mask and its fill value
    n = hf.config.n_positions
    hub = {k.removeprefix("transformer."): v for k, v in state.items()}
    for i in range(hf.config.n_layer):
        hub[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        hub[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(hub, folder / "model.safetensors")
    return folder


@torch.no_grad()
def max_logit_difference(ours: GPT, hf: GPT2LMHeadModel, idx: torch.Tensor) -> float:
    return (ours.eval()(idx) - hf(idx).logits).abs().max().item()


@pytest.fixture(scope="module")
def small() -> GPT2LMHeadModel:
    return hf_gpt2(**SMALL)


@pytest.fixture(scope="module")
def small_folder(small, tmp_path_factory) -> Path:
    return save(small, tmp_path_factory.mktemp("small"), "save_pretrained")


@pytest.mark.parametrize("layout", ["save_pretrained", "bin", "hub"])
def test_logits_equal_hugging_face_in_every_layout(layout, small, tmp_path):
    folder = save(small, tmp_path, layout)
    ours = GPT(GPTConfig(emb_dim=32, n_layers=2, n_heads=2, context_length=64, tie_weights=True))
    load_pretrained(ours, str(folder))
    idx = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(1))
    assert max_logit_difference(ours, small, idx) <= 1e-4
    assert ours.head.weight is ours.tok_emb.weight  # tied: the head IS the token embedding
    assert torch.equal(ours.tok_emb.weight, small.transformer.wte.weight)


def test_a_sharded_folder_loads(small, tmp_path):
    small.save_pretrained(tmp_path, max_shard_size="1MB")  # gpt2-xl's size is saved in shards like this
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = GPT(GPTConfig(emb_dim=32, n_layers=2, n_heads=2, context_length=64, tie_weights=True))
    load_pretrained(ours, str(tmp_path))
    idx = torch.randint(0, 50257, (1, 64), generator=torch.Generator().manual_seed(2))
    assert max_logit_difference(ours, small, idx) <= 1e-4


@pytest.fixture(scope="module")
def gpt2_124m(tmp_path_factory) -> tuple[GPT2LMHeadModel, Path]:
    """A random GPT-2 124M in the hub files' layout, built and written once for this module (~550 MB)."""
    hf = hf_gpt2()  # GPT2Config() is GPT-2 124M
    return hf, save(hf, tmp_path_factory.mktemp("gpt2_124m"), "hub")


@pytest.mark.full  # the small layouts' loading, at GPT-2's size (docs/testing.md: two tiers)
def test_gpt2_124m_config_loads_the_124m_weights(gpt2_124m, tmp_path, monkeypatch):
    hf, folder = gpt2_124m
    monkeypatch.chdir(tmp_path)
    # `predict --config configs/gpt2_124m.yaml --model.init_from <folder>`: the greedy tokens after the prompt
    # are the ones Hugging Face's model of the same weights picks
    args = ["predict", "--config", str(REPO / "configs/gpt2_124m.yaml"), "--model.init_from", str(folder)]
    more = ["--data.prompts", '["The Time Traveller"]', "--model.max_new_tokens", "3"]
    cli = main([*args, *more, "--trainer.enable_progress_bar", "false"])
    assert count_params(cli.model.model) == 124_439_808
    ours = cli.model.model
    assert ours.head.weight is ours.tok_emb.weight
    idx = torch.randint(0, 50257, (1, 32), generator=torch.Generator().manual_seed(3))
    assert max_logit_difference(ours, hf, idx) <= 1e-4
    enc, expected = get_tokenizer(), []
    for prompt in cli.datamodule.prompts:
        ids = torch.tensor([enc.encode(prompt)])
        with torch.no_grad():
            for _ in range(3):
                ids = torch.cat([ids, hf(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        expected.append(enc.decode(ids[0].tolist()))
    written = next((tmp_path / "lightning_logs" / "gpt2_124m").glob("version_*/continuations.txt"))
    assert written.read_text() == "".join(f"{text}\n\n" for text in expected)


def test_a_context_of_256_keeps_the_first_256_of_1024_positions(tmp_path):
    hf = hf_gpt2(n_embd=32, n_layer=2, n_head=2)  # GPT-2's 1024 positions, a small body
    folder = save(hf, tmp_path, "hub")
    ours = GPT(GPTConfig(emb_dim=32, n_layers=2, n_heads=2, context_length=256, tie_weights=True))
    load_pretrained(ours, str(folder))
    assert torch.equal(ours.pos_emb.weight, hf.transformer.wpe.weight[:256])
    idx = torch.randint(0, 50257, (2, 256), generator=torch.Generator().manual_seed(4))
    assert max_logit_difference(ours, hf, idx) <= 1e-4


def test_the_finetune_config_fits_gpt2_124m(tmp_path):
    GPT2Config().save_pretrained(tmp_path)  # GPT-2 124M's config.json
    config_text = (REPO / "configs/gpt2_124m_finetune.yaml").read_text()
    config = yaml.safe_load(config_text)
    model, data, trainer = config["model"], config["data"], config["trainer"]
    cfg = GPTConfig(**model["config"], context_length=data["context_length"])
    check_config("gpt2_124m_finetune.yaml", read_config(tmp_path), cfg)  # a GptLitError if it did not fit
    assert model["init_from"] == "gpt2" and model["lr"] < 4e-4  # the released weights, a gentler lr
    assert data["context_length"] <= 256 and trainer["max_epochs"] <= 5
    # fp32 runs everywhere; bf16 is one option away where the device has it
    assert trainer["precision"] == "32-true" and "--trainer.precision bf16-mixed" in config_text


def test_config_json_fields_left_out_are_gpt2configs_defaults_and_variants_are_refused(tmp_path):
    """What transformers reads from a config.json of only its model type (GPT2Config's defaults) is what init_from
    reads; a GPT-2 that computes otherwise than the chapter's GPT (another activation) is one GptLitError."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    hf = GPT2Config.from_pretrained(tmp_path)
    assert read_config(tmp_path) == {
        "vocab_size": hf.vocab_size, "context_length": hf.n_positions, "emb_dim": hf.n_embd, "n_layers": hf.n_layer,
        "n_heads": hf.n_head, "qkv_bias": True, "tie_weights": hf.tie_word_embeddings, "residual": True,
    }  # fmt: skip
    GPT2Config(n_inner=4 * 768, activation_function="gelu_pytorch_tanh").save_pretrained(tmp_path)
    assert read_config(tmp_path)["emb_dim"] == 768  # the same computation, spelled otherwise
    GPT2Config(activation_function="relu").save_pretrained(tmp_path)
    with pytest.raises(GptLitError, match="sets activation_function='relu': not a GPT-2 the chapter's GPT computes"):
        read_config(tmp_path)


class Losses(Callback):
    """Each training step's batch and loss, as the Trainer saw them."""

    def __init__(self):
        self.batches, self.losses = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches.append([t.clone() for t in batch])
        self.losses.append(outputs["loss"].item())


def fit(folder: Path, *more: str) -> tuple[GPTLitCLI, Losses]:
    losses = Losses()
    args = [
        "fit", "--config", str(REPO / "configs/residual.yaml"), *SMALL_ARGS, "--model.init_from", str(folder),
        "--model.config.dropout", "0", "--model.lr", "0.001", "--data.context_length", "32", "--data.batch_size", "4",
        "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar",
        "false", "--trainer.enable_model_summary", "false",
        "--trainer.callbacks", "[]",  # no diagnostics: this reads the losses and the weights (last.ckpt is still saved)
        *more,
    ]  # fmt: skip
    return main(args, extra_callbacks=[losses]), losses


def test_fit_starts_from_the_weights_and_resumes_exactly(small, small_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # two steps (one per epoch) in one go
    whole, seen = fit(small_folder, "--trainer.max_epochs", "2", "--trainer.logger.init_args.save_dir", "whole")
    x, y = seen.batches[0]
    with torch.no_grad():
        hf_loss = F.cross_entropy(small(x).logits.flatten(0, 1), y.flatten()).item()
    assert seen.losses[0] == pytest.approx(hf_loss, abs=1e-5)  # step 1 ran on exactly the released weights

    # the same two steps as one step, then a resume from its last.ckpt
    fit(small_folder, "--trainer.max_epochs", "1")
    ckpt = tmp_path / "lightning_logs" / "residual" / "version_0" / "checkpoints" / "last.ckpt"
    resumed, after = fit(small_folder, "--trainer.max_epochs", "2", "--ckpt_path", str(ckpt))
    assert after.losses == pytest.approx(seen.losses[1:], abs=1e-6)
    x2, y2 = after.batches[0]
    with torch.no_grad():
        released = F.cross_entropy(small(x2).logits.flatten(0, 1), y2.flatten()).item()
    assert abs(after.losses[0] - released) > 1e-3  # the resumed step did not start from the released weights again
    final = whole.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, final[name], rtol=0, atol=1e-6, msg=name)

    # The run's config keeps init_from; with its checkpoint, test needs no released weights (the folder is gone).
    run = tmp_path / "lightning_logs" / "residual" / "version_1"
    tested = main(["test", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
                   "--model.init_from", str(tmp_path / "deleted_folder")])  # fmt: skip
    for name, value in tested.model.state_dict().items():
        torch.testing.assert_close(value, final[name], rtol=0, atol=1e-6, msg=name)


# --- one clear line for every mistake ---


def error_line(capsys, *args: str) -> str:
    """The `error:` line `python -m gpt_lit predict` ends with (in process), for the small model's config."""
    base = ["predict", "--config", str(REPO / "configs/residual.yaml"), *SMALL_ARGS, "--data.context_length", "32",
            "--data.prompts", '["I saw"]']  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main([*base, "--trainer.logger", "false", *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def test_bad_folders_are_one_clear_line(small, small_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((small_folder / "config.json").read_text())
    line = error_line(capsys, "--model.init_from", "empty")
    assert "empty has no weights: it needs model.safetensors (or pytorch_model.bin) beside config.json" in line

    for name in ("model.safetensors", "pytorch_model.bin"):
        cut = save(small, tmp_path / name.replace(".", "_"), "bin" if name.endswith(".bin") else "save_pretrained")
        whole = (cut / name).read_bytes()
        (cut / name).write_bytes(whole[: len(whole) // 2])  # a download that stopped half way
        line = error_line(capsys, "--model.init_from", str(cut))
        kind = "safetensors" if name.endswith("safetensors") else "PyTorch"
        assert f"{cut / name} is not a readable {kind} file: truncated or corrupt" in line

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    line = error_line(capsys, "--model.init_from", str(llama))
    assert f"{llama / 'config.json'} is not a GPT-2 config (model_type 'llama', not 'gpt2')" in line

    line = error_line(capsys, "--model.init_from", "gpt3")
    assert "model.init_from gpt3: no such folder, and not one of the GPT-2 hub names" in line


def test_an_architecture_that_differs_names_the_fields(small_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    wider = ["--model.config.emb_dim", "64", "--model.config.n_layers", "3", "--data.context_length", "128"]
    line = error_line(capsys, "--model.init_from", str(small_folder), *wider)
    assert line == (
        f"error: model.init_from {small_folder} does not fit the configured model: model.config.emb_dim is 32 in "
        f"the weights but 64 here; model.config.n_layers is 2 in the weights but 3 here; data.context_length is "
        f"128 here, longer than the weights' position table (64 positions); use --model.config.emb_dim 32 "
        f"--model.config.n_layers 2 --data.context_length 64 (or less)"
    )


def test_without_huggingface_hub_a_hub_name_says_to_install_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` now fails
    line = error_line(capsys, "--model.init_from", "gpt2")
    assert "model.init_from gpt2 is a Hugging Face hub name, and fetching it needs huggingface_hub" in line
    assert 'pip install -e ".[hub]"' in line and "--model.init_from models/gpt2" in line


def test_a_hub_name_that_cannot_be_fetched_fails_before_the_model_is_built(tmp_path, monkeypatch, capsys):
    # GPT-2 124M's random initialisation takes seconds: a failed download says so before any of it
    monkeypatch.chdir(tmp_path)
    built = []
    monkeypatch.setattr(module, "GPT", lambda cfg: built.append(cfg))  # what GPTLightning builds its model with

    def refused(*args, **kwargs):
        raise ConnectionError("[Errno 111] Connection refused")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refused)
    line = error_line(capsys, "--model.init_from", "gpt2")
    assert line.startswith("error: cannot download openai-community/gpt2 ([Errno 111] Connection refused); ")
    assert built == []


def test_without_network_a_hub_name_says_what_to_download_and_where(tmp_path, monkeypatch, capsys):
    # the README's command with the hub out of reach (nothing listens at its address) and an empty cache; in this
    # process, with the address and the cache huggingface_hub read from HF_ENDPOINT and HF_HOME at its import
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(SystemExit) as stop:
        main(["predict", "--config", str(REPO / "configs/gpt2_124m.yaml"), "--model.init_from", "gpt2"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[-1:] and "Traceback" not in err
    assert lines[-1].startswith("error: cannot download openai-community/gpt2 ([Errno 111] Connection refused); ")
    assert lines[-1].endswith(
        "download config.json and model.safetensors from https://huggingface.co/openai-community/gpt2/tree/main "
        "into a folder such as models/gpt2/ (or: hf download openai-community/gpt2 config.json model.safetensors "
        "--local-dir models/gpt2), then use --model.init_from models/gpt2"
    )
    assert not list((tmp_path / "hf").rglob("*.safetensors"))  # nothing was downloaded
