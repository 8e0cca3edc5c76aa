"""Inside the block on the reader's own sentence: the page ``predict --model.inspect true`` writes for each prompt.

``write_page`` writes ``inspect_<n>.html`` into predict's folder: one self-contained page (its style, script, data
and figures inline, so it opens from the file system with no network) with a heading (the checkpoint, its step and
epoch, the model's settings), then 1. the sentence coloured by the model's loss on each token, with its top 5
predictions; 2. every block's and head's attention over the sentence, with its entropy; 3. the logit lens; 4. the
residual stream's size and what each sub-layer wrote. The figures also go to ``inspect_<n>/*.png``. Every number
comes from the chapter's measuring functions (gpt_lit/measure.py) on one pass over the prompt, at most its last
context_length tokens.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import shutil
from pathlib import Path

import torch
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from gpt_lit.measure import (
    attention_entropy,
    attention_weights,
    lens_logits,
    record_blocks,
    stream_sizes,
    token_losses,
    write_sizes,
)
from gpt_lit.model import GPT
from gpt_lit.tokenizer import get_tokenizer


@torch.no_grad()
def measurements(model: GPT, ids: torch.Tensor) -> dict:
    """What the page shows of ``model`` on the token IDs ``ids`` (T,), at most context_length of them, as plain lists:
    ``tokens`` (each token's text); ``loss`` (T - 1: token t's loss, -log p(token t | the tokens before it), nats);
    ``top5`` (T: at each position the model's 5 likeliest next tokens, [text, probability]); ``attn`` (block, head,
    query position t: the weights over positions 0 .. t); ``entropy`` (block, head: the mean entropy of its rows,
    nats); ``lens`` (block, position: the top next token read out after that block, [text, probability]; the last
    block's is the model's own); ``stream``, ``attn_write``, ``ffn_write`` (block, position: RMS sizes)."""
    idx = ids[None]  # (1, T)
    record = record_blocks(model, idx)
    weights = [w[0] for w in attention_weights(model, record)]  # n_layers x (n_heads, T, T)
    lens = torch.stack([lens_logits(model, record, b)[0] for b in range(len(weights))]).softmax(-1)  # (L, T, vocab)
    top_p, top_i = lens.max(dim=-1)  # (L, T)
    top5_p, top5_i = lens[-1].topk(5, dim=-1)  # (T, 5)
    losses = token_losses(model, idx[:, :-1], idx[:, 1:])[0] if len(ids) > 1 else torch.zeros(0)  # (T - 1,)
    attn_write, ffn_write = write_sizes(record)
    return {
        "tokens": [token_text(i) for i in ids.tolist()],
        "loss": rounded(losses),
        "top5": [predictions(i, p) for i, p in zip(top5_i, top5_p, strict=True)],
        "attn": [[[rounded(row[: t + 1]) for t, row in enumerate(head)] for head in w] for w in weights],
        "entropy": [rounded(attention_entropy(w).mean(-1)) for w in weights],
        "lens": [predictions(i, p) for i, p in zip(top_i, top_p, strict=True)],
        "stream": rounded(stream_sizes(record)[:, 0]),
        "attn_write": rounded(attn_write[:, 0]),
        "ffn_write": rounded(ffn_write[:, 0]),
    }


def token_text(i: int) -> str:
    """Token ``i`` as the page shows it (a line break as ``↵``)."""
    return get_tokenizer().decode([i]).replace("\n", "↵")


def rounded(x: torch.Tensor) -> list:
    """``x`` as nested lists of numbers rounded to 4 decimals (the page's data)."""
    return [rounded(row) for row in x] if x.dim() > 1 else [round(v, 4) for v in x.tolist()]


def predictions(ids: torch.Tensor, probs: torch.Tensor) -> list[list]:
    """[token text, probability] of each of ``ids`` with its ``probs``."""
    return [[token_text(i), round(p, 4)] for i, p in zip(ids.tolist(), probs.tolist(), strict=True)]


def label_tokens(ax, tokens: list[str], axis: str = "x", most: int = 32, start: int = 0) -> None:
    """Label ``axis`` of ``ax`` with ``tokens`` (at start, start + 1, ...): every one, or every k-th up to ``most``."""
    step = -(-len(tokens) // most)
    at = range(0, len(tokens), step)
    rotation = 90 if axis == "x" else 0
    getattr(ax, f"set_{axis}ticks")([start + k for k in at], [tokens[k] for k in at], fontsize=6, rotation=rotation)


def figures(m: dict) -> dict[str, bytes]:
    """The page's figures as PNG files: loss, attention, lens and stream (``measurements``' numbers drawn)."""
    tokens, n_layers, n_heads = m["tokens"], len(m["attn"]), len(m["attn"][0])
    T, wide = len(tokens), max(6.0, len(tokens) / 12)
    left = 0.8 / wide  # room for the y labels
    fig = Figure(figsize=(wide, 2.6))
    ax = fig.add_axes((left, 0.32, 0.97 - left, 0.58))
    ax.bar(range(1, T), m["loss"], color="tab:red")
    ax.set(xlim=(-0.5, T - 0.5), ylabel="loss (nats)", title="How surprised the model is at each token")
    label_tokens(ax, tokens)
    figs = {"loss": fig}
    # Every head's map in one image (one axes draws much faster than 16), the bottom-left one labelled.
    gap = max(2, T // 8)
    grid = torch.full((n_layers * (T + gap) - gap, n_heads * (T + gap) - gap), float("nan"))  # NaN: white
    fig = Figure(figsize=(2.4 * n_heads, 2.4 * n_layers))
    ax = fig.add_axes((0.1, 0.1, 0.88, 0.86))
    for b in range(n_layers):
        for h in range(n_heads):
            y, x = b * (T + gap), h * (T + gap)  # the map's top left corner
            for t, weights in enumerate(m["attn"][b][h]):
                grid[y + t, x : x + t + 1] = torch.tensor(weights)
            title = f"block {b + 1}, head {h + 1}: {m['entropy'][b][h]:.2f} nats"
            ax.text(x + T / 2, y - 1, title, ha="center", va="bottom", fontsize=7)
    ax.imshow(grid, cmap="Blues", norm=PowerNorm(0.5, 0, 1), interpolation="nearest")  # as the page: sqrt(weight)
    label_tokens(ax, tokens, most=16)
    label_tokens(ax, tokens, "y", most=16, start=(n_layers - 1) * (T + gap))
    ax.spines[:].set_visible(False)
    figs["attention"] = fig
    fig = Figure(figsize=(wide, 1.2 + 0.35 * n_layers))
    ax = fig.add_axes((left, 0.35, 0.97 - left, 0.55))
    ax.imshow([[p for _, p in row] for row in m["lens"]], cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_yticks(range(n_layers), [f"block {b + 1}" for b in range(n_layers)])
    ax.set_title("Logit lens: the top next token's probability after each block")
    label_tokens(ax, tokens)
    figs["lens"] = fig
    fig = Figure(figsize=(wide, 5))
    top, bottom = fig.subplots(2, 1, sharex=True)
    fig.subplots_adjust(left=left, right=0.97, bottom=0.16, top=0.93, hspace=0.15)
    for b in range(n_layers):
        top.plot(m["stream"][b], label=f"after block {b + 1}")
        line = bottom.plot(m["attn_write"][b], label=f"block {b + 1} attention")[0]
        bottom.plot(m["ffn_write"][b], "--", color=line.get_color(), label=f"block {b + 1} feed-forward")
    top.set(ylabel="stream size (RMS)", title="The residual stream at each position")
    bottom.set(ylabel="size written (RMS)")
    top.legend(fontsize=6, ncol=n_layers)
    bottom.legend(fontsize=6, ncol=n_layers)
    label_tokens(bottom, tokens)
    figs["stream"] = fig
    out = {}
    for name, fig in figs.items():
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        out[name] = buffer.getvalue()
    return out


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Inside the block: {title}</title>
<style>
body {{ font: 15px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }}
section {{ margin: 2em 0; }} img {{ max-width: 100%; }} .note {{ color: #a33; }}
.tok {{ white-space: pre; border-radius: 3px; cursor: pointer; }} .q {{ outline: 2px solid #333; }}
#words {{ font-size: 19px; line-height: 2; }} #look div {{ margin: .3em 0; line-height: 1.8; }}
.maps {{ display: grid; gap: 1em; }} figure {{ margin: 0; }} canvas {{ cursor: crosshair; }}
.scroll {{ overflow-x: auto; }} table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border: 1px solid #ddd; padding: 2px 4px; white-space: pre; text-align: center; }}
</style></head><body>
<h1>Inside the block: {title}</h1>
<p id="heading">{heading}</p>{note}
<section id="sentence"><h2>1. How surprised the model is at each token</h2>
<p>Each token is coloured by the model's loss on it, -log p(token | the tokens before it): green, it expected it;
red, it did not (10 nats or more). Hover over or click a token for the 5 tokens the model expected there.</p>
<p id="mean"></p><p id="words"></p><p id="expected"></p>{loss}</section>
<section id="attention"><h2>2. Attention, every block and head</h2>
<p>Where each head of <select id="block"></select> looks from the token <b id="from"></b> (click a token, or a
row of a map): each token shaded by the head's attention weight on it (by its square root, here and in the maps,
so that attention spread over many tokens still shows).</p><div id="look"></div>
<p>Each head's map: row t spreads over tokens 0 .. t (columns); beside it the mean entropy of its rows, in nats
(0: one token; log t: even over t tokens).</p><div class="maps" id="maps"></div></section>
<section id="lens"><h2>3. The logit lens</h2>
<p>What the stream after each block would predict, read out through the final norm and the head: the top next
token at each position and its probability. The last row is the model's own prediction.</p>
<div class="scroll"><table id="lens-table"></table></div>{lens}</section>
<section id="stream"><h2>4. The residual stream</h2>
<p>The stream's size (RMS of its numbers) at each position after each block, and the size of what each
sub-layer wrote into it.</p>{stream}</section>
<script type="application/json" id="data">{data}</script>
<script>
const D = JSON.parse(document.getElementById("data").textContent), T = D.tokens.length;
const $ = id => document.getElementById(id), pct = p => (100 * p).toFixed(1) + "%";
function el(tag, text, style, title) {{
  const e = document.createElement(tag);
  e.textContent = text || ""; if (style) e.style.cssText = style; if (title) e.title = title; return e;
}}
const expected = k => k ? `${{D.tokens[k]}}: loss ${{D.loss[k - 1].toFixed(2)}} nats; the model expected ` +
  D.top5[k - 1].map(([w, p]) => `"${{w}}" ${{pct(p)}}`).join(", ") : `${{D.tokens[0]}}: the first token, not predicted`;
const mean = D.loss.reduce((a, b) => a + b, 0) / D.loss.length;
$("mean").textContent = D.loss.length ? `Mean loss ${{mean.toFixed(3)}} nats over ${{D.loss.length}} tokens.` : "";
D.tokens.forEach((t, k) => {{
  const hue = k ? 120 * Math.max(0, 1 - D.loss[k - 1] / 10) : 0;
  const s = el("span", t, k ? `background: hsl(${{hue}}, 75%, 78%)` : "", expected(k));
  s.className = "tok"; s.onclick = () => {{ $("expected").textContent = expected(k); pick(k); }}; $("words").append(s);
}});
let q = T - 1;
D.attn.forEach((_, b) => $("block").append(new Option(`block ${{b + 1}}`, b)));
function pick(k) {{ q = k; look(); }}
function look() {{
  $("from").textContent = D.tokens[q];
  $("look").replaceChildren(...D.attn[+$("block").value].map((rows, h) => {{
    const line = el("div", `head ${{h + 1}}: `);
    D.tokens.forEach((t, k) => {{
      const w = k <= q ? rows[q][k] : 0, s = el("span", t, `background: rgba(30, 90, 200, ${{w ** 0.5}})`, pct(w));
      s.className = k === q ? "tok q" : "tok"; s.onclick = () => pick(k); line.append(s);
    }});
    return line;
  }}));
}}
$("block").onchange = look; look();
const size = Math.max(2, Math.floor(210 / T)), margin = 60;
$("maps").style.gridTemplateColumns = `repeat(${{D.attn[0].length}}, max-content)`;
D.attn.forEach((heads, b) => heads.forEach((rows, h) => {{
  const fig = el("figure"), cv = el("canvas"), c = cv.getContext("2d");
  cv.width = cv.height = margin + size * T; c.font = "9px sans-serif";
  rows.forEach((r, i) => r.forEach((w, j) => {{
    c.fillStyle = `rgba(30, 90, 200, ${{w ** 0.5}})`; c.fillRect(margin + j * size, margin + i * size, size, size);
  }}));
  c.fillStyle = "#222"; c.textAlign = "right";
  for (let k = 0; k < T; k += Math.ceil(10 / size)) {{
    c.fillText(D.tokens[k], margin - 3, margin + k * size + size / 2 + 3);
    c.save(); c.translate(margin + k * size + size / 2 + 3, margin - 3); c.rotate(-Math.PI / 2);
    c.textAlign = "left"; c.fillText(D.tokens[k], 0, 0); c.restore();
  }}
  const at = e => Math.floor((e.offsetY - margin) / size);
  cv.onmousemove = e => {{
    const i = at(e), j = Math.floor((e.offsetX - margin) / size);
    cv.title = i >= 0 && j >= 0 && j <= i && i < T ? `${{D.tokens[i]}} -> ${{D.tokens[j]}}: ${{pct(rows[i][j])}}` : "";
  }};
  cv.onclick = e => {{ if (at(e) >= 0 && at(e) < T) {{ $("block").value = b; pick(at(e)); }} }};
  fig.append(cv, el("figcaption", `block ${{b + 1}}, head ${{h + 1}}: entropy ${{D.entropy[b][h].toFixed(2)}} nats`));
  $("maps").append(fig);
}}));
const header = $("lens-table").insertRow();
header.append(el("th", "after"), ...D.tokens.map(t => el("th", t)));
D.lens.forEach((row, b) => {{
  const tr = $("lens-table").insertRow();
  tr.append(el("th", b === D.lens.length - 1 ? `block ${{b + 1}} (the model)` : `block ${{b + 1}}`));
  row.forEach(([w, p]) => tr.append(el("td", `${{w}}\\n${{pct(p)}}`, `background: rgba(30, 90, 200, ${{p * 0.8}})`)));
}});
</script></body></html>
"""


def page(m: dict, pngs: dict[str, bytes], heading: str, note: str = "") -> str:
    """The page's HTML: ``measurements``' numbers as its data, the PNG ``figures`` inline but the attention maps,
    which the page draws from the data."""
    data = json.dumps(m, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    images = {name: f'<p><img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}"></p>'
              for name, png in pngs.items()}  # fmt: skip
    note = note and f'<p class="note">{html.escape(note)}</p>'
    del images["attention"]  # drawn by the page's script, to be chosen from
    return PAGE.format(title=html.escape("".join(m["tokens"])[:60]), heading=heading, note=note, data=data, **images)


def heading(model: GPT, checkpoint: str | None, step: int | None, epoch: int | None) -> str:
    """The page's heading (HTML): the checkpoint, when it was saved, the model's settings, residual or not."""
    cfg = model.cfg
    saved = f"{checkpoint}, saved at step {step} in epoch {epoch} (from 0)" if checkpoint else "No checkpoint"
    names = ("emb_dim", "n_layers", "n_heads", "context_length", "dropout", "qkv_bias", "tie_weights")
    settings = ", ".join(f"{k} {str(getattr(cfg, k)).lower()}" for k in names)
    residual = "with" if cfg.residual else "without"
    return f"{html.escape(saved)}.<br>The model: {settings}; <b>{residual} residual connections</b>."


def write_page(
    folder: Path, number: int, model: GPT, ids: torch.Tensor, checkpoint: str | None, saved_at: tuple
) -> Path:
    """Write prompt ``number``'s page, ``folder/inspect_<number>.html``, and its figures, ``inspect_<number>/*.png``,
    for ``model`` (in eval mode) on the token IDs ``ids`` (T,), of which it reads the last context_length. The
    heading names ``checkpoint`` (None: the model's initial weights) and its (step, epoch) ``saved_at``. The
    files appear whole or not at all: each is written under a temporary name first."""
    context = model.cfg.context_length
    m = measurements(model, ids[-context:])
    crop = f"The prompt has {len(ids)} tokens, more than context_length={context}: the page shows its last {context}."
    pngs = figures(m)
    text = page(m, pngs, heading(model, checkpoint, *saved_at), crop if len(ids) > context else "")
    target, pictures = folder / f"inspect_{number}.html", folder / f"inspect_{number}"
    staging, draft = folder / f".inspect_{number}.partial", folder / f".inspect_{number}.html.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, png in pngs.items():
        (staging / f"{name}.png").write_bytes(png)
    draft.write_text(text, encoding="utf-8")
    shutil.rmtree(pictures, ignore_errors=True)
    os.replace(staging, pictures)
    os.replace(draft, target)
    return target
