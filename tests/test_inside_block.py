"""Inside the block: attention per head, the residual stream, the logit lens and the loss by position.

The figures drawn again each validation against full draws; the loss by position on one and two processes against
``F.cross_entropy``; then a short run of the shipped config as a user runs it, with and without the four callbacks,
whose logged values equal gpt_lit.measure's on the final weights (the measurements themselves: test_measure.py).
"""

from __future__ import annotations

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

from gpt_lit.diagnostics import AttentionMaps, LogitLens, PositionSimilarity, ResidualStream
from gpt_lit.diagnostics.position_loss import PositionMeans
from gpt_lit.measure import (
    attention_entropy,
    attention_weights,
    batch_rms,
    lens_losses,
    position_similarity,
    record_blocks,
    stream_sizes,
    update_ratios,
)
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


@pytest.mark.parametrize("residual", [True, False])
def test_the_sentences_weights_are_those_of_the_sentence_alone(residual):
    """AttentionMaps reads the sentence's image off the batch's pass: causal rows see nothing after the sentence."""
    model, x = tiny_model(residual), tokens()
    in_batch = attention_weights(model, record_blocks(model, x))
    alone = attention_weights(model, record_blocks(model, x[:1, :5]))
    for got, want in zip(in_batch, alone, strict=True):
        assert torch.allclose(got[0, :, :5, :5], want[0], atol=1e-6)


# a figure as wide as its texts; a wider one, the shipped configs' (the `full` tier: the same drawing, larger)
@pytest.mark.parametrize("n_heads, n_tokens", [(2, 6), pytest.param(4, 24, marks=pytest.mark.full)])
def test_the_attention_image_redrawn_each_epoch_equals_a_full_draw(n_heads, n_tokens):
    """Every image after the first draws only the weights and the two texts on the saved rest (blitting): the pixels
    must be a full draw's. Also past the widest texts the figure makes room for (block 100, epoch 1,000 at step
    10^7)."""
    from conftest import figure_pixels

    from gpt_lit.diagnostics.figures import AttentionChart, attention_figure

    labels = [f"t{i}" for i in range(n_tokens)]
    shape = (n_heads, n_tokens, n_tokens)
    figure = AttentionChart(labels, n_heads)
    when = ((0, 0.0, None), (1, 3.0, None), (7, 9.0, None), (8, 9.0, None), (1000.5, 9.0, 10**7), (9, 3.0, None))
    for epoch, scale, step in when:  # uniform rows, then sharper and sharper ones
        for block in (1, 2, 100, 1):
            seed = torch.Generator().manual_seed(10 * int(epoch) + block)
            weights = torch.softmax(torch.randn(shape, generator=seed) * scale, -1)
            full = attention_figure(weights, labels, block=block, epoch=epoch, step=step)
            assert np.array_equal(figure.pixels(weights, block, epoch, step), figure_pixels(full)), (block, epoch)


def test_a_figure_drawn_again_each_epoch_into_the_same_axes_reaches_tensorboard_as_a_new_figure(tmp_path):
    """Each chart is one figure, emptied and drawn again after every validation: the image TensorBoard reads back
    (decoded by Pillow, its size and pixels) must be what a new figure of the same data draws."""
    import io

    from conftest import figure_pixels
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter

    from gpt_lit.diagnostics import figures as f

    epochs = [{"epoch": e, "step": 5 * e, "blocks": [9 - e, 8 - 2 * e, 7.5 - e], "losses": [9 - e / (p + 1) for p in
               range(16)], "embeddings": 0.7, "rms": [1 + e, 2 + e, 3 * e + 1], "train": 9 - e, "val": 9.5 - e}
              for e in range(1, 6)]  # fmt: skip
    figures = {  # name: (legend, draw(axes, n))
        "losses": (False, lambda ax, n: f.draw_losses(ax, epochs[:n], 6.3, True)),
        "grad_norm": (False, lambda ax, n: f.draw_grad_norms(ax, [3.0 / n, 2.0 / n, 1.0], 5 * n)),  # new limits
        "similarity": (True, lambda ax, n: f.draw_by_block(
            ax, [{**e, "blocks": [0.2, 0.5, 0.9]} for e in epochs[:n]], None, "similarity", None)),
        "lens": (True, lambda ax, n: f.draw_by_block(ax, epochs[:n], None, "lens", 6.3)),
        "lens, 5 epochs": (True, lambda ax, n: f.draw_by_block(ax, epochs[:n], 5, "lens", 6.3)),
        "lens, a new x axis": (True, lambda ax, n: f.draw_by_block(  # one more depth from 3 on
            ax, [{**e, "blocks": e["blocks"] + [7.0] * (n >= 3)} for e in epochs[:n]], 5, "lens", 6.3)),
        "position": (True, lambda ax, n: f.draw_positions(ax, epochs[:n], 6.3, None)),
        "stream": (True, lambda ax, n: f.draw_stream(ax, epochs[:n], n % 2 == 1, None)),  # the title changes too
        "stream, under a decade": (True, lambda ax, n: f.draw_stream(  # minor tick labels next to the y label
            ax, [{**e, "embeddings": 0.3, "rms": [0.31 + 0.01 * e["epoch"], 0.45, 0.6]} for e in epochs[:n]], True,
            None)),
    }  # fmt: skip
    writer = SummaryWriter(str(tmp_path))
    for name, (legend, draw) in figures.items():
        chart = f.Chart()
        for n in range(1, 4):  # drawn again twice: new limits, a title and (from 3 on) an x axis that change
            draw(chart.axes(legend), n)
            writer.add_figure(name, chart.fig, n, close=False)
    writer.close()
    events = EventAccumulator(str(tmp_path), size_guidance={IMAGES: 0})
    events.Reload()
    for name, (legend, draw) in figures.items():
        images = events.Images(name)
        assert [image.step for image in images] == [1, 2, 3], name
        for n, image in enumerate(images, 1):
            draw((new := f.Chart()).axes(legend), n)
            new = figure_pixels(new.fig)
            assert (image.height, image.width) == new.shape[:2] == (400, 700), (name, n)
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(image.encoded_image_string))), new), (name, n)


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
    kept = [ln for ln in lines if not any(f"diagnostics.{name} " in ln for name in FOUR)]
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
    # Each value against gpt_lit.measure on the final weights and the callback's windows.
    k = ResidualStream().num_sequences
    assert AttentionMaps().num_sequences == PositionSimilarity().num_sequences == k > n
    record = record_blocks(module.model, torch.stack([val[i][0] for i in range(k)]))
    similarity = [position_similarity(out).mean().item() for out in record.block_out]
    sizes, (_, ffn) = batch_rms(stream_sizes(record)), update_ratios(record)
    entropies = [attention_entropy(w).mean().item() for w in attention_weights(module.model, record)]
    for i in (1, 2):
        assert values(acc, f"similarity/block_{i}")[-1][1] == pytest.approx(similarity[i - 1], abs=1e-5)
        assert values(acc, f"stream/rms/block_{i}")[-1][1] == pytest.approx(sizes[i - 1].item(), rel=1e-5)
        assert values(acc, f"stream/update/ffn_{i}")[-1][1] == pytest.approx(ffn[i - 1].item(), rel=1e-5)
        assert values(acc, f"attention/entropy/block_{i}")[-1][1] == pytest.approx(entropies[i - 1], abs=1e-5)
    lens = lens_losses(module.model, record_blocks(module.model, x), y)[0].mean().item()
    assert values(acc, "lens/block_1")[-1][1] == pytest.approx(lens, abs=1e-4)


def test_each_blocks_attention_image_is_a_drawing_of_its_own_weights(runs):
    """The last images of blocks 1 and 2, decoded from the run's events, against a full draw of each block's weights
    on the final model (the first validation window's first tokens, in the pass over the probe's windows)."""
    import io

    from conftest import figure_pixels
    from PIL import Image

    from gpt_lit.diagnostics.attention import token_labels
    from gpt_lit.diagnostics.figures import attention_figure

    (acc, module), _ = runs
    probe = AttentionMaps()  # the shipped config's: the defaults
    n, val = probe.num_tokens, module.trainer.datamodule.val_set
    windows = torch.stack([val[i][0] for i in range(probe.num_sequences)])
    module.eval()
    weights = [w[0, :, :n, :n] for w in attention_weights(module.model, record_blocks(module.model, windows))]
    labels = token_labels(windows[0, :n].tolist())
    for i, own in enumerate(weights, 1):
        last = acc.Images(f"attention/block_{i}")[-1]
        shown = np.asarray(Image.open(io.BytesIO(last.encoded_image_string)))
        drawn = figure_pixels(attention_figure(own, labels, block=i, epoch=2))  # after epoch 1, the last
        assert np.array_equal(shown, drawn), f"block {i}"
    block_1_as_2 = figure_pixels(attention_figure(weights[0], labels, block=2, epoch=2))
    assert not np.array_equal(shown, block_1_as_2)  # block 2's weights are not block 1's, in the picture too


def test_loss_by_position_averages_to_loss_val(runs):
    (acc, module), _ = runs
    [callback] = [cb for cb in module.trainer.callbacks if type(cb).__name__ == "PositionLoss"]
    for (step, val), point in zip(values(acc, "loss/val"), callback.history, strict=True):
        assert point["step"] == step and len(point["losses"]) == 32
        assert sum(point["losses"]) / 32 == pytest.approx(val, abs=1e-5)
    for p in (1, 8, 32):
        assert values(acc, f"loss_by_position/{p}")[-1][1] == pytest.approx(callback.history[-1]["losses"][p - 1])
