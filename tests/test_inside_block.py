"""Inside the block: attention per head, the residual stream, the logit lens and the loss by position.

Each instrument against a computation written out here (the softmax by hand, a block's forward by hand,
``F.cross_entropy`` on the model's logits), on a tiny model with weights scaled up so that nothing is
uniform; then a short run of the shipped config as a user runs it, with and without the four callbacks.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from conftest import REPO, TINY
from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, EventAccumulator

from gpt_lit.callbacks import (
    AttentionMaps,
    LogitLens,
    PositionSimilarity,
    ResidualStream,
    block_attentions,
    lens_losses,
    probe,
    row_entropy,
    stream_sizes,
)
from gpt_lit.callbacks.block_pass import SharedPass, record_blocks
from gpt_lit.callbacks.position_loss import PositionMeans
from gpt_lit.callbacks.probe import diagnostic_threads
from gpt_lit.callbacks.similarity import block_similarities
from gpt_lit.model import GPT, GPTConfig
from gpt_lit.module import GPTLightning
from gpt_lit.run.cli import main

T, V = 12, 97


def tiny_model(residual: bool) -> GPT:
    """2 blocks, 2 heads, 16 wide; weights drawn with std 0.3 so attention rows and losses are far from uniform."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, context_length=T, emb_dim=16, n_layers=2, n_heads=2, residual=residual))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


def tokens(batch: int = 3, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(1))


def embed(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    return model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1]))


def layer_norm(x: torch.Tensor, norm) -> torch.Tensor:
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    return norm.weight * (x - mean) / torch.sqrt(var + norm.eps) + norm.bias


def block_by_hand(blk, x: torch.Tensor, residual: bool) -> dict[str, torch.Tensor]:
    """One block's forward written out from its submodules: its streams and its branches' outputs."""
    a = blk.attn(layer_norm(x, blk.norm1))
    mid = x + a if residual else a
    f = blk.ffn(layer_norm(mid, blk.norm2))
    return {"in": x, "attn": a, "mid": mid, "ffn": f, "out": mid + f if residual else f}


@pytest.mark.parametrize("residual", [True, False])
def test_attention_weights_are_the_written_out_softmax_of_each_head(residual):
    model, idx = tiny_model(residual), tokens()
    weights = block_attentions(model, idx)
    x = embed(model, idx)
    n_heads, d = 2, 8
    for blk, w in zip(model.blocks, weights, strict=True):
        assert w.shape == (3, n_heads, T, T)
        assert torch.allclose(w.sum(-1), torch.ones(3, n_heads, T), atol=1e-6)  # every row sums to 1
        assert (w.triu(diagonal=1) == 0).all()  # nothing from a later token
        xn = layer_norm(x, blk.norm1)  # (B, T, 16)
        W, b = blk.attn.qkv.weight, blk.attn.qkv.bias  # (48, 16), (48,): q, k, v rows in that order
        for h in range(n_heads):
            q = xn @ W[h * d : (h + 1) * d].T + b[h * d : (h + 1) * d]  # (B, T, d)
            k = xn @ W[16 + h * d : 16 + (h + 1) * d].T + b[16 + h * d : 16 + (h + 1) * d]
            for t in range(T):
                scores = (q[:, t : t + 1] * k[:, : t + 1]).sum(-1) / math.sqrt(d)  # (B, t + 1): keys 0 .. t
                e = torch.exp(scores - scores.max(-1, keepdim=True).values)
                assert torch.allclose(w[:, h, t, : t + 1], e / e.sum(-1, keepdim=True), atol=1e-6)
        # The model's own attention (scaled_dot_product_attention) is these weights times v, then proj.
        v = (xn @ W[32:].T + b[32:]).view(3, T, n_heads, d).transpose(1, 2)  # (B, n_heads, T, d)
        mixed = (w @ v).transpose(1, 2).reshape(3, T, 16)
        assert torch.allclose(blk.attn.proj(mixed), blk.attn(xn), atol=1e-5)
        x = block_by_hand(blk, x, residual)["out"]


@pytest.mark.parametrize("residual", [True, False])
def test_the_sentences_weights_are_those_of_the_sentence_alone(residual):
    """AttentionMaps reads the sentence's image off the batch's pass: causal rows see nothing after the sentence."""
    from gpt_lit.callbacks import AttentionMaps

    model, x = tiny_model(residual), tokens()
    sentence, entropies = AttentionMaps(num_tokens=5).measure(model, x)
    alone = block_attentions(model, x[:1, :5])
    for got, want in zip(sentence, alone, strict=True):
        assert got.shape == (2, 5, 5) and torch.allclose(got, want[0], atol=1e-6)
    assert entropies == pytest.approx([row_entropy(w).mean().item() for w in block_attentions(model, x)])


@pytest.mark.parametrize("n_heads, n_tokens", [(2, 6), (4, 24)])  # a figure as wide as its texts, a wider one
def test_the_attention_image_redrawn_each_epoch_equals_a_full_draw(n_heads, n_tokens):
    """Every block's image after the first, and later epochs, are put together from saved pixels and the weights
    painted anew: the pixels must be a full draw's. Also past the widest texts the figure makes room for (block 100,
    epoch 1,000 at step 10^7), where the title and "when" are drawn for each image."""
    from conftest import figure_pixels

    from gpt_lit.callbacks.attention import AttentionFigure, attention_figure, attention_when

    labels = [f"t{i}" for i in range(n_tokens)]
    shape = (n_heads, n_tokens, n_tokens)
    figure = AttentionFigure(torch.full(shape, 1 / n_tokens), labels)
    assert figure.split is not None
    when = ((0, 0.0, None), (1, 3.0, None), (7, 9.0, None), (8, 9.0, None), (1000.5, 9.0, 10**7), (9, 3.0, None))
    for epoch, scale, step in when:  # uniform rows, then sharper and sharper ones
        for block in (1, 2, 100, 1):
            seed = torch.Generator().manual_seed(10 * int(epoch) + block)
            weights = torch.softmax(torch.randn(shape, generator=seed) * scale, -1)
            full = attention_figure(weights, labels, block=block, epoch=epoch)
            full.texts[1].set_text(attention_when(epoch, step))  # "epoch 1000, step 10000000": a validation within
            assert np.array_equal(figure.pixels(weights, block, epoch, step), figure_pixels(full)), (block, epoch)


def test_a_figure_drawn_again_each_epoch_into_the_same_axes_reaches_tensorboard_as_a_new_figure(tmp_path):
    """Each chart is one figure, emptied and drawn again after every validation: the image TensorBoard reads back
    (decoded by Pillow, its size and pixels) must be what a new figure of the same data draws."""
    import io

    from conftest import figure_pixels
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter

    from gpt_lit.callbacks.figures import ReusedFigure, add_figure, grad_norm_figure, loss_figure, similarity_figure
    from gpt_lit.callbacks.logit_lens import lens_figure
    from gpt_lit.callbacks.position_loss import position_figure
    from gpt_lit.callbacks.stream import stream_figure

    epochs = [{"epoch": e, "step": 5 * e, "blocks": [9 - e, 8 - 2 * e, 7.5 - e], "losses": [9 - e / (p + 1) for p in
               range(16)], "embeddings": 0.7, "rms": [1 + e, 2 + e, 3 * e + 1], "train": 9 - e, "val": 9.5 - e}
              for e in range(1, 6)]  # fmt: skip
    figures = {
        "losses": lambda n, into: loss_figure(epochs[:n], 6.3, True, into),
        "grad_norm": lambda n, into: grad_norm_figure([3.0 / n, 2.0 / n, 1.0], 5 * n, into),  # shrinking: new limits
        "similarity": lambda n, into: similarity_figure([{**e, "blocks": [0.2, 0.5, 0.9]} for e in epochs[:n]], into),
        "lens": lambda n, into: lens_figure(epochs[:n], 6.3, into),
        "lens, 5 epochs": lambda n, into: lens_figure(epochs[:n], 6.3, into, last=5),  # the colour bar kept
        "lens, a new x axis": lambda n, into: lens_figure(  # one more depth at 3: saved again at 4, put back at 5
            [{**e, "blocks": e["blocks"] + [7.0] * (n >= 3)} for e in epochs[:n]], 6.3, into, last=5
        ),
        "position": lambda n, into: position_figure(epochs[:n], 6.3, into),
        "stream": lambda n, into: stream_figure(epochs[:n], n % 2 == 1, into),  # the title changes too
        "stream, under a decade": lambda n, into: stream_figure(  # minor tick labels, wide ones, next to the y label
            [{**e, "embeddings": 0.3, "rms": [0.31 + 0.01 * e["epoch"], 0.45, 0.6]} for e in epochs[:n]], True, into
        ),
    }
    writer = SummaryWriter(str(tmp_path))
    for name, draw in figures.items():
        reused = ReusedFigure()
        for n in range(1, 6):
            add_figure([writer], name, draw(n, reused), n)
    writer.close()
    events = EventAccumulator(str(tmp_path), size_guidance={IMAGES: 0})
    events.Reload()
    for name, draw in figures.items():
        images = events.Images(name)
        assert [image.step for image in images] == [1, 2, 3, 4, 5], name
        for n, image in enumerate(images, 1):
            new = figure_pixels(draw(n, None))
            assert (image.height, image.width) == new.shape[:2] == (400, 700), (name, n)
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(image.encoded_image_string))), new), (name, n)


def test_row_entropy_in_nats():
    rows = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    assert torch.allclose(row_entropy(rows), torch.tensor([0.0, math.log(2), math.log(3)]))
    model = tiny_model(True)
    w = model.blocks[0].attn.weights(torch.zeros(1, 4, 16))  # equal keys: even rows, log(t + 1)
    assert torch.allclose(row_entropy(w)[0, 0], torch.log(torch.arange(1.0, 5.0)), atol=1e-6)


def test_diagnostics_use_trainings_threads_only_when_training_had_its_cores(monkeypatch):
    clocks = {"wall": 100.0, "cpu": 10.0}
    monkeypatch.setattr(probe.time, "perf_counter", lambda: clocks["wall"])
    monkeypatch.setattr(probe.time, "process_time", lambda: clocks["cpu"])
    choice = probe.ThreadChoice(interval=5.0, share=0.8)

    def after(seconds: float, cpu_seconds: float) -> int:
        clocks["wall"] += seconds
        clocks["cpu"] += cpu_seconds
        return choice(2)

    assert after(0, 0) == 1  # nothing measured yet: one thread
    assert after(60, 115) == 2  # an epoch on two threads that had both cores (1.92 CPU-seconds a second)
    assert after(1, 0.5) == 2  # the same epoch's end: the same choice
    assert after(60, 70) == 1  # another program took a core (1.17 a second)
    assert after(60, 118) == 2  # free again
    assert choice(1) == 1  # never more than training's own

    monkeypatch.setattr(probe, "_THREAD_CHOICE", lambda threads: 1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with diagnostic_threads():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2  # training's number again
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("residual", [True, False])
def test_stream_sizes_and_update_ratios_equal_a_block_forward_by_hand(residual):
    model, idx = tiny_model(residual), tokens()
    sizes = stream_sizes(model, idx)

    def rms(t):
        return math.sqrt((t.double() ** 2).mean().item())

    x = embed(model, idx)
    assert sizes["embeddings"] == pytest.approx(rms(x), rel=1e-5)
    for i, blk in enumerate(model.blocks):
        s = block_by_hand(blk, x, residual)
        assert sizes["attn"][i] == pytest.approx(rms(s["attn"]) / rms(s["in"]), rel=1e-5)
        assert sizes["ffn"][i] == pytest.approx(rms(s["ffn"]) / rms(s["mid"]), rel=1e-5)
        assert sizes["rms"][i] == pytest.approx(rms(s["out"]), rel=1e-5)
        x = s["out"]


@pytest.mark.parametrize("residual", [True, False])
def test_the_lens_reads_each_depth_and_the_last_is_the_models_loss(residual):
    model, idx = tiny_model(residual), tokens(length=T + 1)
    x, y = idx[:, :-1], idx[:, 1:]
    lens = lens_losses(model, x, y)
    assert lens[-1] == pytest.approx(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item(), abs=1e-5)
    after_1 = block_by_hand(model.blocks[0], embed(model, x), residual)["out"]
    logits_1 = layer_norm(after_1, model.final_norm) @ model.head.weight.T
    assert lens[0] == pytest.approx(F.cross_entropy(logits_1.flatten(0, 1), y.flatten()).item(), abs=1e-5)
    assert abs(lens[0] - lens[1]) > 1e-3  # two different readings


def _two_processes(rank: int, port: int, state: dict, windows: torch.Tensor, out: dict) -> None:
    """One of two processes: evaluate every other batch of ``windows`` with GPTLightning.validation_step."""
    torch.set_num_threads(1)  # forked: the parent's OpenMP threads are not here (with more, the first op hangs)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        module = GPTLightning(GPTConfig(vocab_size=V, context_length=T, emb_dim=16, n_layers=2, n_heads=2))
        module.model.load_state_dict(state)
        module.eval()
        means = PositionMeans(T)  # what PositionLoss sums from the validation steps' outputs
        for i, batch in enumerate(windows.split(4)):
            if i % 2 == rank:  # 5 batches: 3 on process 0, 2 on process 1 (and 4 + 3 + ... windows: uneven)
                means.update(module.validation_step((batch[:, :-1], batch[:, 1:]), i)["token_losses"])
        loss, by_position = module.val_loss.compute(), means.compute()  # collectives
        if rank == 0:
            out["loss"], out["by_position"] = loss.item(), by_position.tolist()
    finally:
        dist.destroy_process_group()


def test_loss_by_position_on_one_and_two_processes_is_the_whole_sets_per_position_loss():
    model, windows = tiny_model(True), tokens(batch=19, length=T + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    per_token = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(19, T)
    expected = per_token.mean(0)  # (T,): every window has every position
    whole = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()

    one = GPTLightning(GPTConfig(vocab_size=V, context_length=T, emb_dim=16, n_layers=2, n_heads=2))
    one.model.load_state_dict(model.state_dict())
    one.eval()
    means = PositionMeans(T)
    for i, batch in enumerate(windows.split(4)):
        means.update(one.validation_step((batch[:, :-1], batch[:, 1:]), i)["token_losses"])
    by_position = means.compute()
    assert torch.allclose(by_position, expected, atol=1e-5)
    assert one.val_loss.compute().item() == pytest.approx(whole, abs=1e-5)
    assert by_position.mean().item() == pytest.approx(one.val_loss.compute().item(), abs=1e-5)

    with mp.Manager() as manager:
        out = manager.dict()
        port = 29500 + os.getpid() % 1000
        mp.start_processes(_two_processes, (port, model.state_dict(), windows, out), nprocs=2, start_method="fork")
        assert out["loss"] == pytest.approx(whole, abs=1e-5)
        assert out["by_position"] == pytest.approx(expected.tolist(), abs=1e-5)


FOUR = ("AttentionMaps", "ResidualStream", "LogitLens", "PositionLoss")
SHORT = [*TINY, "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "2", "--data.eval_train", "false",
         "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
         "--trainer.enable_checkpointing", "false"]  # fmt: skip


def fit_events(config, tmp_path, name: str) -> tuple[EventAccumulator, GPTLightning]:
    cli = main(["fit", "--config", str(config), *SHORT, "--trainer.logger.init_args.save_dir", str(tmp_path),
                "--trainer.logger.init_args.name", name])  # fmt: skip
    acc = EventAccumulator(cli.trainer.logger.log_dir, size_guidance={SCALARS: 0, IMAGES: 0})
    acc.Reload()
    return acc, cli.model


def values(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """2 epochs of 2 steps of the shipped residual.yaml (tiny model), with its four callbacks and with them deleted."""
    tmp = tmp_path_factory.mktemp("runs")
    config = REPO / "configs" / "residual.yaml"
    lines = config.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if not any(f"callbacks.{name} " in ln for name in FOUR)]
    kept = [ln for i, ln in enumerate(kept) if not (ln.lstrip().startswith("# attention/") and "Images" not in ln)]
    without = tmp / "without.yaml"
    without.write_text("".join(kept))
    assert len(lines) - len(kept) == 5  # four entries, one of them two lines long
    cwd = os.getcwd()
    os.chdir(tmp)  # a run writes nothing but its logs, and those go to tmp
    try:
        return fit_events(config, tmp, "with"), fit_events(without, tmp, "without")
    finally:
        os.chdir(cwd)


def test_the_four_callbacks_change_no_loss(runs):
    (with_, _), (without, _) = runs
    assert "lens/block_1" in with_.Tags()[SCALARS] and "lens/block_1" not in without.Tags()[SCALARS]
    for tag in ("loss/train_step", "loss/val"):  # dropout on while training: any random number drawn would show
        assert values(with_, tag) == values(without, tag), tag
    assert len(values(with_, "loss/train_step")) == 4


def test_each_instrument_logs_at_the_start_and_at_loss_vals_step(runs):
    (acc, module), _ = runs
    ends = [s for s, _ in values(acc, "loss/val")]
    scalars, images = acc.Tags()[SCALARS], acc.Tags()[IMAGES]
    assert ends == [1, 3]
    for i in (1, 2):
        assert [s for s, _ in values(acc, f"attention/entropy/block_{i}")] == [0, *ends]
        assert [e.step for e in acc.Images(f"attention/block_{i}")] == [0, *ends]
        for tag in (f"stream/rms/block_{i}", f"stream/update/attn_{i}", f"stream/update/ffn_{i}"):
            assert [s for s, _ in values(acc, tag)] == [0, *ends], tag
        assert [s for s, _ in values(acc, f"lens/block_{i}")] == ends
    for tag in ("figures/stream_by_block", "figures/lens_by_block", "figures/loss_by_position"):
        assert tag in images, tag
    positions = sorted(int(m.group(1)) for t in scalars if (m := re.fullmatch(r"loss_by_position/(\d+)", t)))
    assert positions == [1, 8, 32]  # 128 is past this run's context of 32
    # The instruments' values at the end, against a computation of their own on the final weights.
    val = module.trainer.datamodule.val_set
    n = LogitLens().num_sequences  # the shipped configs' lens: the default number of windows
    x, y = torch.stack([val[i][0] for i in range(n)]), torch.stack([val[i][1] for i in range(n)])
    module.eval()
    with torch.no_grad():
        own = F.cross_entropy(module.model(x).flatten(0, 1), y.flatten()).item()
    assert values(acc, "lens/block_2")[-1][1] == pytest.approx(own, abs=1e-4)
    # The probes share one pass of their windows (the lens reads the first): each value as its own pass gives it.
    k = ResidualStream().num_sequences
    assert AttentionMaps().num_sequences == PositionSimilarity().num_sequences == k > n
    first = torch.stack([val[i][0] for i in range(k)])
    similarity, sizes = block_similarities(module.model, first), stream_sizes(module.model, first)
    entropies = [row_entropy(w).mean().item() for w in block_attentions(module.model, first)]
    for i in (1, 2):
        assert values(acc, f"similarity/block_{i}")[-1][1] == pytest.approx(similarity[i - 1], abs=1e-5)
        assert values(acc, f"stream/rms/block_{i}")[-1][1] == pytest.approx(sizes["rms"][i - 1], rel=1e-5)
        assert values(acc, f"stream/update/ffn_{i}")[-1][1] == pytest.approx(sizes["ffn"][i - 1], rel=1e-5)
        assert values(acc, f"attention/entropy/block_{i}")[-1][1] == pytest.approx(entropies[i - 1], abs=1e-5)
    assert values(acc, "lens/block_1")[-1][1] == pytest.approx(lens_losses(module.model, x, y)[0], abs=1e-4)


def test_each_blocks_attention_image_is_a_drawing_of_its_own_weights(runs):
    """The last images of blocks 1 and 2, decoded from the run's events, against a full draw of each block's weights
    on the final model (the first validation window's first tokens, in the pass over the probe's windows)."""
    import io

    from conftest import figure_pixels
    from PIL import Image

    from gpt_lit.callbacks.attention import attention_figure, token_labels

    (acc, module), _ = runs
    probe = AttentionMaps()  # the shipped config's: the defaults
    n, val = probe.num_tokens, module.trainer.datamodule.val_set
    windows = torch.stack([val[i][0] for i in range(probe.num_sequences)])
    module.eval()
    weights = [w[0, :, :n, :n] for w in block_attentions(module.model, windows)]
    labels = token_labels(windows[0, :n].tolist())
    for i, own in enumerate(weights, 1):
        last = acc.Images(f"attention/block_{i}")[-1]
        shown = np.asarray(Image.open(io.BytesIO(last.encoded_image_string)))
        drawn = figure_pixels(attention_figure(own, labels, block=i, epoch=2))  # after epoch 1, the last
        assert np.array_equal(shown, drawn), f"block {i}"
    block_1_as_2 = figure_pixels(attention_figure(weights[0], labels, block=2, epoch=2))
    assert not np.array_equal(shown, block_1_as_2)  # block 2's weights are not block 1's, in the picture too


def test_the_probes_of_one_moment_share_one_pass_and_no_other():
    model, x = tiny_model(residual=True), tokens(batch=4)
    passes = []
    model.blocks[0].register_forward_hook(lambda *_: passes.append(1))
    shared = SharedPass()
    first = shared(model, x, moment=(5, 1))
    assert shared(model, x, moment=(5, 1)) is first and len(passes) == 1  # the same moment, the same windows
    two = shared(model, x[:2], moment=(5, 1))  # fewer windows: the first rows of the same pass
    assert len(passes) == 1 and torch.equal(two.block_out[1], first.block_out[1][:2])
    torch.testing.assert_close(two.block_out[1], record_blocks(model, x[:2]).block_out[1])
    assert len(passes) == 2
    shared(model, x, moment=(7, 2))  # later: the weights may have changed
    shared(model, x.flip(0), moment=(7, 2))  # other windows
    other = tiny_model(residual=False)
    other.blocks[0].register_forward_hook(lambda *_: passes.append(1))
    shared(other, x.flip(0), moment=(7, 2))  # another model
    assert len(passes) == 5


def test_a_model_made_after_another_was_freed_gets_its_own_pass():
    """Models made and freed one after another, each measured at the same moment on the same windows (as tests and
    scripts do): each gets its own weights, though a new model usually gets the freed one's ``id`` (its config is
    made beforehand, so the model is the first object of its size made after the free)."""
    x, model = tokens(), None
    configs = [GPTConfig(vocab_size=V, context_length=T, emb_dim=16, n_layers=2, n_heads=2, residual=r) for r in
               (True, False)]  # fmt: skip
    for i in range(20):
        torch.manual_seed(i)  # before the free: it makes objects too
        del model
        model = GPT(configs[i % 2]).eval()
        sentence, _ = AttentionMaps(num_tokens=5).measure(model, x)  # the shared pass, at moment (0, 0)
        for got, want in zip(sentence, block_attentions(model, x[:1, :5]), strict=True):
            torch.testing.assert_close(got, want[0], msg=f"model {i} was handed another model's pass")


def test_the_position_figures_octave_means_are_those_of_their_positions():
    """Octaves 1, 2-3, 4-7 and the last from 8 to the end (8-15 and a short 16-20 are one), by hand on 20 losses."""
    from gpt_lit.callbacks.position_loss import octave_means

    losses = [float(p * p) for p in range(1, 21)]  # position p's loss: p squared
    centres, means = octave_means(losses)
    octaves = [(1, 1), (2, 3), (4, 7), (8, 20)]
    assert means == pytest.approx([sum(p * p for p in range(lo, hi + 1)) / (hi - lo + 1) for lo, hi in octaves])
    assert centres == pytest.approx([math.sqrt(lo * hi) for lo, hi in octaves])
    centres, means = octave_means([5.0] * 32)  # 32 positions: the last octave is 16-32
    assert centres == pytest.approx([1.0, math.sqrt(6), math.sqrt(28), math.sqrt(120), math.sqrt(16 * 32)])
    assert means == pytest.approx([5.0] * 5)


def test_loss_by_position_averages_to_loss_val(runs):
    (acc, module), _ = runs
    [callback] = [cb for cb in module.trainer.callbacks if type(cb).__name__ == "PositionLoss"]
    for (step, val), point in zip(values(acc, "loss/val"), callback.history, strict=True):
        assert point["step"] == step and len(point["losses"]) == 32
        assert sum(point["losses"]) / 32 == pytest.approx(val, abs=1e-5)
    for p in (1, 8, 32):
        assert values(acc, f"loss_by_position/{p}")[-1][1] == pytest.approx(callback.history[-1]["losses"][p - 1])
