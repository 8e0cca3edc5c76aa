"""The chapter's three diagnostics, as a user sees them: in the TensorBoard event file of a tiny `fit`."""

from __future__ import annotations

import math
from collections import Counter

import lightning as L
import pytest
from conftest import QUIET_TRAINER
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2, metadata

from gpt_lit.callbacks import BlockGradNorms, PositionSimilarity, UnigramBaseline
from gpt_lit.data import TimeMachineData, default_data_dir, load_book
from gpt_lit.model import GPTConfig
from gpt_lit.module import GPTLightning
from gpt_lit.tokenizer import get_tokenizer

N_LAYERS = 3
CLIP = 1e-3  # clip the total gradient norm far below any block's: the logged norms must be from before clipping


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> EventAccumulator:
    """2 epochs of 2 steps (4 steps), logging every 2nd step, then the run's event file."""
    tmp_path = tmp_path_factory.mktemp("fit")
    L.seed_everything(123)
    data = TimeMachineData(context_length=32, batch_size=4, eval_batch_size=8)
    model = GPTLightning(GPTConfig(context_length=32, emb_dim=32, n_layers=N_LAYERS, n_heads=2))
    logger = TensorBoardLogger(tmp_path, name="tiny", default_hp_metric=False)
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        logger=logger,
        callbacks=[BlockGradNorms(), PositionSimilarity(num_sequences=2), UnigramBaseline()],
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=1,
        **QUIET_TRAINER,
        log_every_n_steps=2,
        gradient_clip_val=CLIP,
    )
    trainer.fit(model, data)
    acc = EventAccumulator(logger.log_dir, size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    return acc


def steps(events: EventAccumulator, tag: str) -> list[int]:
    return [e.step for e in events.Scalars(tag)]


def test_gradient_norm_of_every_block_on_logging_steps_only(events):
    tags = sorted(t for t in events.Tags()[SCALARS] if t.startswith("grad_norm/"))
    assert tags == [f"grad_norm/block_{i}" for i in range(1, N_LAYERS + 1)]
    for tag in tags:
        norms = [e.value for e in events.Scalars(tag)]
        assert len(norms) == 2, tag  # 4 steps, log_every_n_steps=2
        assert all(math.isfinite(g) and g > 10 * CLIP for g in norms), (tag, norms)  # measured before clipping


def test_position_similarity_at_the_start_and_after_every_epoch(events):
    assert steps(events, "similarity/positions") == [0, 2, 4]
    assert all(-1.0 <= e.value <= 1.0 for e in events.Scalars("similarity/positions"))


def test_unigram_baseline_is_the_entropy_of_the_books_token_frequencies(events):
    ids = get_tokenizer().encode(load_book(default_data_dir()))
    n = len(ids)
    entropy = -math.fsum(c / n * math.log(c / n) for c in Counter(ids).values())
    logged = [e.value for e in events.Scalars("loss/unigram_baseline")]
    assert steps(events, "loss/unigram_baseline") == [0, 1, 3]  # at the start, then on the logging steps
    assert all(v == pytest.approx(entropy, abs=1e-6) for v in logged)
    assert abs(entropy - 6.346) < 0.01  # the chapter prints 6.346 for its copy of the book


def test_custom_scalars_layout_puts_the_losses_and_the_baseline_on_one_chart(events):
    assert metadata.CONFIG_SUMMARY_TAG in events.PluginTagToContent(metadata.PLUGIN_NAME)
    layout = layout_pb2.Layout()
    layout.ParseFromString(events.Tensors(metadata.CONFIG_SUMMARY_TAG)[0].tensor_proto.string_val[0])
    charts = [list(chart.multiline.tag) for category in layout.category for chart in category.chart]
    assert any({"loss/train", "loss/val", "loss/unigram_baseline"} <= set(tags) for tags in charts), charts
    scalars = set(events.Tags()[SCALARS])
    assert {"loss/train", "loss/val", "loss/unigram_baseline"} <= scalars  # the chart's series exist
