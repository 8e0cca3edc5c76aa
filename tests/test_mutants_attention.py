"""AttentionMaps' pieces without a training run: the heads' image, the tokens' labels, the figure's texts, and what
the callback logs after a validation (scalars and images), each checked against values written out here. In
milliseconds to seconds, so that mutation testing (docs/testing.md) runs these for every mutant of
gpt_lit/diagnostics/attention.py and the attention figure of gpt_lit/diagnostics/figures.py."""

import io
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gpt_lit.diagnostics.attention import AttentionMaps, token_labels
from gpt_lit.diagnostics.figures import AttentionChart, attention_figure, attention_title, heads_image, when
from gpt_lit.measure import attention_entropy, attention_weights, record_blocks
from gpt_lit.model import GPT, GPTConfig

NAN = math.nan


def causal_weights(n_heads: int, T: int, seed: int = 0) -> torch.Tensor:
    """(n_heads, T, T) rows that sum to 1 over the keys up to each query, 0 after it."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_heads, T, T, generator=g).masked_fill(torch.ones(T, T).triu(1).bool(), -math.inf)
    return torch.softmax(scores, dim=-1)


def test_the_heads_image_puts_heads_side_by_side_white_above_the_diagonal_and_between_heads():
    weights = torch.tensor([[[1.0, 0.0], [0.25, 0.75]], [[1.0, 0.0], [0.5, 0.5]]])
    expected = np.array([[1.0, NAN, NAN, NAN, 1.0, NAN], [0.25, 0.75, NAN, NAN, 0.5, 0.5]])
    np.testing.assert_array_equal(heads_image(weights), expected)  # NaN where NaN
    np.testing.assert_array_equal(heads_image(weights, gap=1), np.delete(expected, 2, axis=1))


def test_when_the_weights_were_measured_and_the_title():
    assert when(0, after=True) == "at the start"
    assert when(0.0, 4, after=True) == "at the start"
    assert when(3, after=True) == "after epoch 2"
    assert when(1.0, 7, after=True) == "after epoch 0"
    assert when(2.5, 17, after=True) == "epoch 2, step 17"
    assert when(2.5, after=True) == "epoch 2"
    assert attention_title(3) == "Block 3: where each token (row) looks among the tokens up to it (columns)"


def test_token_labels_show_line_breaks_and_at_most_12_characters():
    # GPT-2's tokens: "The", " Time", " Trave", "ller", "\n", " said", " administration"
    assert token_labels([464, 3862, 43662, 6051, 198, 531, 3662]) == [
        "The", " Time", " Trave", "ller", "↵", " said", " administrat"
    ]


def test_the_figure_shows_every_head_the_tokens_and_when():
    weights, labels = causal_weights(2, 3), ["a", "b", "c"]
    fig = attention_figure(weights, labels, block=2, epoch=1.5)
    ax = fig.axes[0]
    [shown] = ax.images
    np.testing.assert_array_equal(shown.get_array().filled(NAN), heads_image(weights))
    assert shown.get_clim() == (0.0, 1.0)
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["head 1", *labels, "head 2", *labels, *labels]  # above each head, below it, left of the rows
    assert [t.get_text() for t in fig.texts] == [attention_title(2), "epoch 1"]
    assert fig.axes[1].get_ylabel() == "attention weight"


def tensorboard_trainer(tmp_path):
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(str(tmp_path), name="run", version=0)
    return L.Trainer(logger=logger, max_epochs=3, enable_progress_bar=False, enable_model_summary=False), logger


def tiny_module(seed: int = 0) -> SimpleNamespace:
    """What the callback reads of a LightningModule: a GPT (3 blocks, 2 heads, weights scaled up), its device."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(context_length=8, emb_dim=8, n_layers=3, n_heads=2)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20.0)
    return SimpleNamespace(model=model, device=torch.device("cpu"))


def fit_start(probe: AttentionMaps, ids: list[int]) -> None:
    """The callback's start of a fit whose first validation window is ``ids`` (no logger: nothing measured)."""
    window = torch.tensor(ids)
    trainer = SimpleNamespace(strategy=None, datamodule=SimpleNamespace(val_set=[(window, window)]), ckpt_path=None,
                              loggers=[], is_global_zero=True)  # fmt: skip
    probe.on_train_start(trainer, None)


def test_after_a_validation_each_blocks_entropy_and_image_reach_tensorboard(tmp_path):
    from conftest import figure_pixels

    trainer, logger = tensorboard_trainer(tmp_path)
    probe = AttentionMaps(num_tokens=4)
    fit_start(probe, [464, 3862, 43662, 6051, 198, 531])
    labels = ["The", " Time", " Trave", "ller"]
    moments = [(0, 0.0), (6, 1.0), (9, 1.5)]  # the start, after epoch 0, mid epoch 1
    for step, epoch in moments:
        module = tiny_module(seed=step)  # other weights at each moment
        scalars = probe.probe(trainer, module, step, epoch)
        weights = attention_weights(module.model, record_blocks(module.model, probe.inputs))
        assert scalars == {f"attention/entropy/block_{b}": pytest.approx(attention_entropy(w).mean().item())
                           for b, w in enumerate(weights, 1)}  # fmt: skip
        logger.experiment.flush()
        acc = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
        acc.Reload()
        for b, w in enumerate(weights, 1):
            event = acc.Images(f"attention/block_{b}")[-1]
            assert event.step == step
            pixels = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)))
            full = figure_pixels(attention_figure(w[0, :, :4, :4], labels, block=b, epoch=epoch, step=step))
            assert np.array_equal(pixels, full), (b, step)
    assert len({float(v) for v in scalars.values()}) == 3 and max(scalars.values()) < 0.9 * math.log(4)  # sharp


def test_the_labels_follow_the_batch_of_each_fit(tmp_path):
    trainer, _ = tensorboard_trainer(tmp_path)
    probe, module = AttentionMaps(num_tokens=2), tiny_module()
    for ids, labels in (([464, 3862, 43662], ["The", " Time"]), ([198, 531], ["↵", " said"])):
        fit_start(probe, ids)
        probe.probe(trainer, module, 1, 1.0)
        assert [t.get_text() for t in probe.chart.fig.axes[0].texts][-2:] == labels  # left of the rows


def test_the_figures_layout_every_label_at_its_token_inside_the_figure_and_off_the_image():
    """What a reader sees of the layout, measured on the drawn figure in pixels: square cells; each head's title
    centred over its head; each key's label under its column, upright text reading bottom to top; each query's
    label left of its row; the colour bar right of the image, as tall, from 0 to 1; nothing cut off or on the
    weights."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    # AttentionMaps' default: 24 tokens (a sentence of the validation text); 2 heads, the narrowest figure of a run
    # with them (fewer tokens: test_a_short_sentences_figure_is_as_wide_as_its_title_and_when_need)
    sentence = ["The", " Time", " Trave", "ller", " said", ",", " \"", "I", " saw", " it", " myself"]
    labels = sentence * 2 + ["↵", "-", "."]
    n_heads, T = 2, len(labels)
    fig = attention_figure(causal_weights(n_heads, T), labels, block=2, epoch=3)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax, cax = fig.axes
    image = ax.get_window_extent(renderer)  # pixels, from the bottom left
    columns = n_heads * (T + 2) - 2
    cell_w, cell_h = image.width / columns, image.height / T
    assert cell_w == pytest.approx(cell_h, abs=0.01) and cell_w >= 10  # square cells, large enough to see
    figure = fig.bbox
    # room for the labels and, over the image, for the widest title and "when" (block 99; epoch 998, step 999,999)
    title, said = fig.texts
    shown = title.get_text(), said.get_text()
    title.set_text(attention_title(99))
    said.set_text(when(998.5, 999_999))
    widest = title.get_window_extent(renderer).width + said.get_window_extent(renderer).width
    title.set_text(shown[0])
    said.set_text(shown[1])
    assert figure.height - image.height <= 200 and figure.width - max(image.width, widest) <= 250  # and no more
    texts = [t for t in ax.texts + fig.texts]
    assert len(ax.texts) == n_heads + n_heads * T + T
    for text in texts:  # nothing cut off by the figure's edges
        box = text.get_window_extent(renderer)
        assert figure.x0 <= box.x0 and box.x1 <= figure.x1 and figure.y0 <= box.y0 and box.y1 <= figure.y1, text
    heads = [t for t in ax.texts if t.get_text().startswith("head ")]
    assert [t.get_text() for t in heads] == [f"head {h + 1}" for h in range(n_heads)]
    for h, text in enumerate(heads):
        box = text.get_window_extent(renderer)
        centre = image.x0 + (h * (T + 2) + T / 2) * cell_w
        assert box.y0 >= image.y1 and abs((box.x0 + box.x1) / 2 - centre) <= 1.5, h  # over its head, centred
        assert box.y0 <= image.y1 + cell_h  # right over it
    keys = [t for t in ax.texts if t.get_rotation() == 90]
    assert [t.get_text() for t in keys] == labels * n_heads  # under every head, in order
    for i, text in enumerate(keys):
        h, j = divmod(i, T)
        box = text.get_window_extent(renderer)
        centre = image.x0 + (h * (T + 2) + j + 0.5) * cell_w
        assert box.y1 <= image.y0 and abs((box.x0 + box.x1) / 2 - centre) <= 1.5, text.get_text()
        assert box.y1 >= image.y0 - cell_h / 2  # right under the image
        assert box.width < cell_w  # upright: a label fits its column
    queries = [t for t in ax.texts if t.get_rotation() == 0 and not t.get_text().startswith("head ")]
    assert [t.get_text() for t in queries] == labels
    for j, text in enumerate(queries):
        box = text.get_window_extent(renderer)
        centre = image.y1 - (j + 0.5) * cell_h  # row j from the top
        assert box.x1 <= image.x0 and box.x1 >= image.x0 - cell_w and abs((box.y0 + box.y1) / 2 - centre) <= 1.5
    for text in keys + queries:
        assert text.get_fontsize() < fig.texts[0].get_fontsize()  # the tokens small, the title large
    bar = cax.get_window_extent(renderer)
    assert image.x1 < bar.x0 and bar.x1 <= figure.x1 and bar.width >= 5
    assert (bar.y0, bar.y1) == pytest.approx((image.y0, image.y1), abs=1)  # as tall as the image
    assert cax.get_ylim() == (0.0, 1.0) and cax.get_ylabel() == "attention weight"
    title, said = fig.texts
    assert title.get_text() == attention_title(2) and said.get_text() == "after epoch 2"
    t, w = title.get_window_extent(renderer), said.get_window_extent(renderer)
    assert t.y0 >= image.y1 and w.y0 >= image.y1 and t.x1 < w.x0  # over the image, side by side
    # "after epoch 3" ends where the image ends, or, over an image narrower than the widest title and "when" with a
    # gap of 0.3 inches (30 pixels) between them, that much right of the image's start
    assert abs(w.x1 - (image.x0 + max(image.width, widest + 30))) <= 1.5
    # The weights' colours: viridis from 0 to 1 (the colour bar's scale); the first query sees only itself: 1.0.
    rgb = np.asarray(canvas.buffer_rgba())[..., :3]
    height = canvas.get_width_height()[1]
    row0 = round(height - image.y1 + cell_h / 2)
    col0 = round(image.x0 + cell_w / 2)
    assert np.abs(rgb[row0, col0] / 255 - np.array(colormaps["viridis"](1.0)[:3])).max() < 0.01


@pytest.mark.parametrize("n_heads, T", [(1, 3), (2, 5), (4, 5)])
def test_a_short_sentences_figure_is_as_wide_as_its_title_and_when_need(n_heads, T):
    """AttentionMaps(num_tokens=5): the image is narrower than the title and the widest "when" text; the figure
    widens to show both whole, side by side, and no wider; the image keeps its square cells, the bar its place."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    labels = ["The", " Time", " Trave", "ller", " said"][:T]
    # the widest texts it makes room for: block 99, within epoch 998 at step 999,999
    fig = attention_figure(causal_weights(n_heads, T), labels, block=99, epoch=998.5, step=999_999)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    figure, (ax, cax) = fig.bbox, fig.axes
    image, bar = ax.get_window_extent(renderer), cax.get_window_extent(renderer)
    title, said = (t.get_window_extent(renderer) for t in fig.texts)
    assert figure.x0 <= title.x0 and title.x1 < said.x0 and said.x1 <= figure.x1  # both whole, side by side
    assert title.y0 >= image.y1 and said.y0 >= image.y1
    assert figure.width <= title.width + said.width + 250  # margins, a gap: no wider than they need
    columns = n_heads * (T + 2) - 2
    assert image.width / columns == pytest.approx(image.height / T, abs=0.01)  # square cells
    assert image.x1 < bar.x0 <= image.x1 + 30 and bar.x1 <= figure.x1  # the bar right of the image, as before


def test_a_validation_within_an_epoch_is_drawn_with_its_step():
    # val_check_interval 0.5: the validation in the middle of epoch 1, at step 7, reads "epoch 1, step 7"
    from conftest import figure_pixels

    labels = [f" w{i}" for i in range(24)]
    weights = causal_weights(2, 24)
    full = attention_figure(weights, labels, block=1, epoch=1.5, step=7)
    assert full.texts[1].get_text() == "epoch 1, step 7"
    assert np.array_equal(AttentionChart(labels, 2).pixels(weights, 1, 1.5, 7), figure_pixels(full))
