"""`python -m gpt_lit export`: the chapter's GPT as a Hugging Face GPT-2 folder, checked with `transformers` itself.

Offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE): the folder alone must be enough. The reference is
`GPT2LMHeadModel.from_pretrained(folder)`'s logits against the chapter's model's, and `pipeline("text-generation")`'s
greedy text against gpt_lit's `generate`; `model.init_from` must read the same weights back. The README's export
commands are run as it writes them, and the pipeline's default text must be `predict`'s.
"""

import ast
import inspect
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from test_cli import run_main

from gpt_lit.hub.export import export_model
from gpt_lit.hub.pretrained import load_pretrained
from gpt_lit.model import GPT, GPTConfig, generate
from gpt_lit.module import GPTLightning
from gpt_lit.run.checkpoints import read_checkpoint
from gpt_lit.tokenizer import get_tokenizer

# The chapter's head is untied and its q, k, v have biases; GPT-2 ties the head. A context shorter than GPT-2's 1024
# positions, and dropout on (as the chapter trains): the exported model must compute without it, as gpt_lit's
# eval mode does.
VARIANTS = {
    "chapter": GPTConfig(context_length=16, emb_dim=32, n_layers=2, n_heads=2, dropout=0.1, tie_weights=False),
    "tied_no_qkv_bias": GPTConfig(context_length=24, emb_dim=32, n_layers=1, n_heads=4, qkv_bias=False,
                                  tie_weights=True),
}  # fmt: skip
TEXT = "The Time Traveller (for so it will be convenient to speak of him)"
PREDICT_MAX_NEW_TOKENS = inspect.signature(GPTLightning).parameters["max_new_tokens"].default  # predict's default


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def random_gpt(cfg: GPTConfig) -> GPT:
    """GPT(cfg) with every parameter random, biases and norms included (GPT's own init zeroes the biases and sets
    the norms to 1, which would hide a bias or norm mapped to the wrong place)."""
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tmp_path_factory):
    model = random_gpt(VARIANTS[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    export_model(model, folder, PREDICT_MAX_NEW_TOKENS)
    return model, folder


def ids(n: int) -> torch.Tensor:
    return torch.tensor([get_tokenizer().encode(TEXT)[:n]])


def test_transformers_loads_the_folder_and_computes_the_same_logits(exported):
    from transformers import GPT2LMHeadModel

    model, folder = exported
    hf = GPT2LMHeadModel.from_pretrained(folder)
    cfg = model.cfg
    assert not hf.training  # from_pretrained's eval mode: no dropout, as gpt_lit evaluates
    assert hf.config.n_positions == cfg.context_length and hf.config.tie_word_embeddings == cfg.tie_weights
    x = ids(cfg.context_length)  # the whole context
    with torch.no_grad():
        diff = (hf(x).logits - model(x)).abs().max().item()
    assert diff < 1e-5


def test_pipeline_writes_what_gpt_lit_generates(exported):
    from transformers import pipeline

    model, folder = exported
    prompt = ids(5)
    ours = get_tokenizer().decode(generate(model, prompt, max_new_tokens=6)[0].tolist())  # greedy
    generator = pipeline("text-generation", model=str(folder))
    text = get_tokenizer().decode(prompt[0].tolist())
    theirs = generator(text, max_new_tokens=6, do_sample=False)[0]["generated_text"]
    assert theirs == ours


def test_init_from_reads_the_export_back_to_the_same_weights(exported):
    model, folder = exported
    fresh = GPT(model.cfg)
    load_pretrained(fresh, str(folder))
    theirs, ours = fresh.state_dict(), model.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)
    assert (fresh.head.weight is fresh.tok_emb.weight) == model.cfg.tie_weights


def test_the_folder_has_the_tokenizer_files_of_gpt2(exported):
    from transformers import AutoTokenizer

    _, folder = exported
    assert json.loads((folder / "config.json").read_text())["model_type"] == "gpt2"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer(TEXT).input_ids == get_tokenizer().encode(TEXT)
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 50256


def test_export_of_a_fit_without_a_config(tiny_run, capsys, monkeypatch, tmp_path):
    """The tiny run (an override of residual.yaml's sizes): `export --ckpt_path last` takes the run's settings."""
    from transformers import GPT2LMHeadModel

    monkeypatch.chdir(tiny_run.root)
    code, out, err = run_main(capsys, "export", "--ckpt_path", "last", "--out", str(tmp_path / "hf"))
    assert code == 0, err[-3000:]
    ckpt = read_checkpoint(str(tiny_run.version / "checkpoints" / "last.ckpt"))[0]
    model = GPT(GPTConfig(**ckpt["hyper_parameters"]["config"]))
    model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()})
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    x = ids(32)
    with torch.no_grad():
        assert (hf(x).logits - model.eval()(x)).abs().max().item() < 1e-5
    files = ["config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
             "tokenizer_config.json"]  # fmt: skip
    assert sorted(os.listdir(tmp_path / "hf")) == sorted(files)


def test_a_model_without_residuals_is_one_error_line(capsys, tmp_path):
    cfg = GPTConfig(context_length=16, emb_dim=32, n_layers=1, n_heads=2, residual=False)
    ckpt = tmp_path / "no_residual.ckpt"
    state = {f"model.{k}": v for k, v in GPT(cfg).state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": {"config": vars(cfg)}}, ckpt)
    args = ["--model.config.emb_dim", "32", "--model.config.n_layers", "1", "--model.config.n_heads", "2",
            "--data.context_length", "16"]  # fmt: skip
    code, _, err = run_main(capsys, "export", "--config", "no_residual", *args, "--ckpt_path", str(ckpt),
                            "--out", str(tmp_path / "hf"))  # fmt: skip
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: export: the model has no residual connections (model.config.residual false)")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(("context_length", "n"), [(128, PREDICT_MAX_NEW_TOKENS), (16, 8)])
def test_generation_config_is_predicts_greedy_default_within_the_context(context_length, n, tmp_path):
    """predict's default count of new tokens where half the context holds it (the chapter's 128), else half the
    context (a 16-token model), so a prompt of up to the other half fits: the pipeline, given only the prompt,
    writes gpt_lit's greedy text of that length."""
    from transformers import GenerationConfig, pipeline

    model = random_gpt(GPTConfig(context_length=context_length, emb_dim=32, n_layers=1, n_heads=2))
    export_model(model, tmp_path, PREDICT_MAX_NEW_TOKENS)
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {
        "do_sample": False, "max_new_tokens": n, "bos_token_id": 50256, "eos_token_id": 50256, "pad_token_id": 50256,
    }  # fmt: skip
    config = GenerationConfig.from_pretrained(tmp_path)
    assert (config.do_sample, config.max_new_tokens, config.pad_token_id) == (False, n, 50256)
    prompt = ids(4)
    ours = get_tokenizer().decode(generate(model, prompt, n)[0].tolist())
    theirs = pipeline("text-generation", model=str(tmp_path))(get_tokenizer().decode(prompt[0].tolist()))
    assert theirs[0]["generated_text"] == ours


def readme_export_block() -> list[str]:
    """The lines of the code block of the README's "Export to Hugging Face" section."""
    section = (REPO / "README.md").read_text(encoding="utf-8").split("\n## Export to Hugging Face\n", 1)[1]
    return section.split("\n## ", 1)[0].split("```bash\n", 1)[1].split("```", 1)[0].splitlines()


@pytest.mark.full  # the one-liner in a process of its own (docs/testing.md: two tiers)
def test_the_readmes_export_one_liner_prints_predicts_continuation(tiny_run, capsys, monkeypatch):
    """The README's two lines as written, in the tiny run's folder (context 32, shorter than predict's default 50
    new tokens and a prompt): the one-liner runs offline and prints predict's greedy continuation of its prompt, as
    many new tokens as generation_config.json gives (half the context)."""
    export, one_liner = (line for line in readme_export_block() if line.startswith(("python -m gpt_lit", "python -c")))
    assert export.endswith("--out exported/")
    monkeypatch.chdir(tiny_run.root)
    code, _, err = run_main(capsys, *shlex.split(export)[3:])
    assert code == 0, err[-3000:]
    argv = shlex.split(one_liner)
    done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pad_token_id" not in done.stderr and "maximum length" not in done.stderr
    (printed,) = ast.literal_eval(done.stdout.strip())
    prompt = re.search(r"model='exported'\)\('([^']*)'\)", argv[2]).group(1)  # the text the pipeline is given
    n = json.loads((tiny_run.root / "exported" / "generation_config.json").read_text())["max_new_tokens"]
    assert n == 32 // 2 < PREDICT_MAX_NEW_TOKENS
    code, out, err = run_main(capsys, "predict", "--ckpt_path", "last", "--data.prompts", json.dumps([prompt]),
                              "--model.max_new_tokens", str(n))  # fmt: skip
    assert code == 0, err[-3000:]
    assert printed["generated_text"] == out.rsplit("\n\n[1 continuation(s) written to ", 1)[0]
