"""The page ``predict --model.inspect true`` writes for each prompt, self-contained (inspect_page.html filled): each
token's loss and top 5 predictions, every head's attention, the logit lens and the residual stream, from measure.py.
"""

import base64
import html
import io
import json
import os
import re
import shutil
from pathlib import Path

import torch
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from gpt_lit import measure
from gpt_lit.model import GPT
from gpt_lit.tokenizer import get_tokenizer


@torch.no_grad()
def measurements(model: GPT, ids: torch.Tensor) -> dict:
    """What the page shows of ``model`` on the token IDs ``ids`` (T,), as plain lists: ``tokens``, ``loss``, ``top5``,
    ``attn`` (block, head, t: weights over 0 .. t), ``entropy``, ``lens``, ``stream``, ``attn_write``, ``ffn_write``."""
    idx = ids[None]  # (1, T)
    record = measure.record_blocks(model, idx)
    weights = [w[0] for w in measure.attention_weights(model, record)]  # n_layers x (n_heads, T, T)
    lens = torch.stack([measure.lens_logits(model, record, b)[0] for b in range(len(weights))])  # (L, T, vocab)
    lens = lens.softmax(-1)
    top_p, top_i = lens.max(dim=-1)  # (L, T)
    top5_p, top5_i = lens[-1].topk(5, dim=-1)  # (T, 5)
    losses = measure.token_losses(model, idx[:, :-1], idx[:, 1:])[0] if len(ids) > 1 else torch.zeros(0)  # (T - 1,)
    attn_write, ffn_write = measure.write_sizes(record)
    return {
        "tokens": [token_text(i) for i in ids.tolist()],
        "loss": rounded(losses),
        "top5": [predictions(i, p) for i, p in zip(top5_i, top5_p, strict=True)],
        "attn": [[[rounded(row[: t + 1]) for t, row in enumerate(head)] for head in w] for w in weights],
        "entropy": [rounded(measure.attention_entropy(w).mean(-1)) for w in weights],
        "lens": [predictions(i, p) for i, p in zip(top_i, top_p, strict=True)],
        "stream": rounded(measure.stream_sizes(record)[:, 0]),
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


# The page's HTML, style and script (package data, read as a page is written); ``page`` fills its ``{name}`` fields.
PAGE = Path(__file__).parent / "inspect_page.html"
FIELDS = re.compile(r"\{(title|heading|note|loss|lens|stream|data)\}")


def page(m: dict, pngs: dict[str, bytes], heading: str, note: str = "") -> str:
    """The page's HTML: the numbers as its data, the PNGs inline but the attention maps (its script draws them)."""
    data = json.dumps(m, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    images = {name: f'<p><img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}"></p>'
              for name, png in pngs.items()}  # fmt: skip
    note = note and f'<p class="note">{html.escape(note)}</p>'
    del images["attention"]  # drawn by the page's script, to be chosen from
    fields = dict(title=html.escape("".join(m["tokens"])[:60]), heading=heading, note=note, data=data, **images)
    # one pass: the filled text is not read again
    return FIELDS.sub(lambda match: fields[match[1]], PAGE.read_text(encoding="utf-8"))


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
    """Write ``folder/inspect_<number>.html`` and ``inspect_<number>/*.png`` for ``model`` (eval mode) on the last
    context_length of ``ids`` (T,), each under a temporary name first, so they appear whole or not at all."""
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
