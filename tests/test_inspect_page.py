"""`predict --model.inspect true`: the page of each prompt, as a reader opens it.

The page's numbers (its data) against the model's own, computed here: the attention rows against
``CausalSelfAttention.weights`` on a forward written out block by block, the lens's last row against
``GPT.forward``, each token's loss against ``F.cross_entropy``, the stream sizes against the block outputs. Then
the command on a copy of the session's tiny run, and the page in a real browser (the system's headless Chromium)
with the network off.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpt_lit.inspect_page import write_page
from gpt_lit.model import GPT, GPTConfig
from gpt_lit.run.cli import main
from gpt_lit.tokenizer import encode, get_tokenizer

SENTENCE = "The Time Traveller (for so it will be convenient to speak of him) was expounding"


def page_data(page: Path) -> dict:
    """The numbers a page shows: its inline data."""
    text = page.read_text(encoding="utf-8")
    return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)[1])


def model(n_layers: int = 2, n_heads: int = 2, context_length: int = 32, residual: bool = True) -> GPT:
    """A small GPT of GPT-2's vocabulary, weights drawn with std 0.3 so that nothing is uniform, in eval mode."""
    torch.manual_seed(0)
    cfg = GPTConfig(context_length=context_length, emb_dim=16, n_layers=n_layers, n_heads=n_heads, residual=residual)
    gpt = GPT(cfg)
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0, 0.3)
    return gpt.eval()


@pytest.mark.parametrize("residual", [True, False])
def test_the_page_shows_the_models_own_numbers(tmp_path, residual):
    gpt, ids = model(residual=residual), torch.tensor(encode(SENTENCE))
    page = write_page(tmp_path, 1, gpt, ids, None, (None, None))
    shown, T = page_data(page), len(ids)
    assert "".join(shown["tokens"]) == SENTENCE
    # The forward written out: every block's attention weights on its norm1 output, and the stream after it.
    with torch.no_grad():
        x = gpt.tok_emb(ids[None]) + gpt.pos_emb(torch.arange(T))
        weights, streams = [], []
        for blk in gpt.blocks:
            weights.append(blk.attn.weights(blk.norm1(x))[0])
            x = blk(x)
            streams.append(x[0])
        logits = gpt(ids[None])[0]  # (T, vocab)
    for b, heads in enumerate(shown["attn"]):
        for h, rows in enumerate(heads):
            for t, row in enumerate(rows):
                assert len(row) == t + 1 and sum(row) == pytest.approx(1, abs=1e-3)
                assert row == pytest.approx(weights[b][h, t, : t + 1].tolist(), abs=1e-4)
            entropy = -(weights[b][h] * weights[b][h].clamp_min(1e-30).log()).sum(-1).mean()
            assert shown["entropy"][b][h] == pytest.approx(entropy.item(), abs=1e-4)
    probs = logits.softmax(-1)
    decode = lambda i: get_tokenizer().decode([i])  # noqa: E731
    assert [w for w, _ in shown["lens"][-1]] == [decode(i) for i in logits.argmax(-1).tolist()]
    assert [p for _, p in shown["lens"][-1]] == pytest.approx(probs.max(-1).values.tolist(), abs=1e-4)
    assert [[w for w, _ in top] for top in shown["top5"]] == [[decode(i) for i in r] for r in probs.topk(5).indices]
    losses = F.cross_entropy(logits[:-1], ids[1:], reduction="none")  # token t's loss, from position t - 1
    assert shown["loss"] == pytest.approx(losses.tolist(), abs=1e-4)
    rms = torch.stack([s.square().mean(-1).sqrt() for s in streams])  # (n_layers, T)
    torch.testing.assert_close(torch.tensor(shown["stream"]), rms, atol=1e-4, rtol=0)
    # Its figures: the PNG files, the same bytes inline in the page (but the attention, which its script draws).
    text = page.read_text(encoding="utf-8")
    pngs = {p.stem: p.read_bytes() for p in (tmp_path / "inspect_1").iterdir()}
    assert sorted(pngs) == ["attention", "lens", "loss", "stream"]
    inline = [base64.b64decode(s) for s in re.findall(r'src="data:image/png;base64,([^"]+)"', text)]
    assert inline == [pngs["loss"], pngs["lens"], pngs["stream"]]
    assert not re.search(r'(src|href)="(?!data:)', text)  # nothing fetched from anywhere
    assert f"<b>{'with' if residual else 'without'} residual connections</b>" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inspect_1", "inspect_1.html"]  # no temporary left


def test_a_prompt_longer_than_the_context_is_shown_by_its_last_tokens(tmp_path):
    gpt, ids = model(context_length=8), torch.tensor(encode(SENTENCE))
    page = write_page(tmp_path, 2, gpt, ids, None, (None, None))
    assert page.name == "inspect_2.html"
    assert "".join(page_data(page)["tokens"]) == get_tokenizer().decode(ids[-8:].tolist())
    note = f"The prompt has {len(ids)} tokens, more than context_length=8: the page shows its last 8."
    assert note in page.read_text()


@pytest.fixture(scope="module")
def inspected(tiny_run, tmp_path_factory) -> tuple[Path, str]:
    """`predict --ckpt_path last --model.inspect true` on a copy of the tiny run: the run folder and what it printed."""
    root = tmp_path_factory.mktemp("inspect")
    shutil.copytree(tiny_run.root / "lightning_logs", root / "lightning_logs")
    before = os.getcwd()
    os.chdir(root)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["predict", "--ckpt_path", "last", "--data.prompts", json.dumps([SENTENCE, "I saw"]),
                  "--model.inspect", "true", "--model.max_new_tokens", "2"])  # fmt: skip
    finally:
        os.chdir(before)
    return root / "lightning_logs" / "residual" / "version_0", out.getvalue()


def test_predict_writes_a_page_for_each_prompt_beside_the_run(inspected):
    run, printed = inspected
    folder = run / "predict" / "last"
    for n, prompt in enumerate([SENTENCE, "I saw"], 1):
        page = folder.relative_to(run.parents[2]) / f"inspect_{n}.html"  # as the run folder's path is given
        assert f"[prompt {n}: its page written to {page}]" in printed
        assert "".join(page_data(folder / f"inspect_{n}.html")["tokens"]) == prompt
        assert {p.name for p in (folder / f"inspect_{n}").iterdir()} == {"attention.png", "lens.png", "loss.png",
                                                                         "stream.png"}  # fmt: skip
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    text = (folder / "inspect_1.html").read_text()
    assert (f"{Path('lightning_logs/residual/version_0/checkpoints/last.ckpt')}, saved at step "
            f"{checkpoint['global_step']} in epoch {checkpoint['epoch']} (from 0)") in text  # fmt: skip
    assert "emb_dim 32, n_layers 2, n_heads 2, context_length 32" in text


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on this machine (.ci/run installs the system's package): the page is not rendered")
    return path


@pytest.mark.full  # Chromium, a process of its own (docs/testing.md: two tiers)
def test_a_browser_shows_the_page_whole_with_the_network_off(tmp_path):
    """The chapter's shape (4 blocks of 4 heads) on a sentence, rendered by headless Chromium with every host
    unreachable: what its script built (the DOM after it ran) and what its console said."""
    gpt, ids = model(n_layers=4, n_heads=4), torch.tensor(encode(SENTENCE))
    page = write_page(tmp_path, 1, gpt, ids, None, (None, None))
    offline = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=socks5://127.0.0.1:9"]
    done = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", *offline, "--enable-logging=stderr", "--v=0",
         "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []  # no error, no message
    dom = done.stdout
    words = re.search(r'<p id="words">(.*?)</p>', dom, re.S)[1]
    spans = re.findall(r'<span [^>]*class="tok"[^>]*>(.*?)</span>', words)
    assert "".join(spans).replace("&amp;", "&") == SENTENCE  # every token, in order
    captions = re.findall(r"<figcaption[^>]*>(block \d, head \d): entropy [\d.]+ nats</figcaption>", dom)
    assert captions == [f"block {b}, head {h}" for b in range(1, 5) for h in range(1, 5)]
    assert dom.count("<canvas") == 16
    table = re.search(r'<table id="lens-table">(.*?)</table>', dom, re.S)[1]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    assert [re.match(r"<th[^>]*>(.*?)</th>", r)[1] for r in rows] == ["after", "block 1", "block 2", "block 3",
                                                                   "block 4 (the model)"]  # fmt: skip
    assert all(r.count("<td") == len(ids) for r in rows[1:])
    assert re.search(r'<div id="look">(<div[^>]*>head \d: .*?</div>){4}</div>', dom, re.S)  # where each head looks
