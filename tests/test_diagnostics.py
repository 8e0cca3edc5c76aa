"""The chapter's diagnostics, as a user sees them: in the TensorBoard event file of a tiny `fit`.

One fit with every diagnostic callback (3 blocks, 2 epochs of 2 steps, logging every 2nd step); each test
reads what TensorBoard would show from the run's event file.
"""

from __future__ import annotations

import io
import math
import re
from collections import Counter

import lightning as L
import matplotlib.image
import pytest
import torch
import torch.nn.functional as F
from conftest import QUIET_TRAINER, windows_by_hand
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, TENSORS, EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2, metadata
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hp_metadata

from gpt_lit.book_source import default_data_dir, load_book
from gpt_lit.data import TimeMachineData
from gpt_lit.diagnostics import BlockGradNorms, ChapterFigures, PositionSimilarity, RunsTable, Samples, UnigramBaseline
from gpt_lit.measure import position_similarity
from gpt_lit.model import GPTConfig, generate
from gpt_lit.module import GPTLightning
from gpt_lit.tokenizer import get_tokenizer

N_LAYERS = 3
CLIP = 1e-3  # clip the total gradient norm far below any block's: the logged norms must be from before clipping
PROMPTS = ["The Time Traveller", "I saw"]
NEW_TOKENS = 8
EPOCH_ENDS = [1, 3]  # 2 steps an epoch: self.log puts the epoch-end losses at the last step's index


def fit_tiny(tmp_path, callbacks: list) -> tuple[L.Trainer, GPTLightning, TimeMachineData]:
    """The tiny fit (seed 123, 2 epochs of 2 steps, one validation batch)."""
    L.seed_everything(123)
    data = TimeMachineData(context_length=32, stride=128, batch_size=4, eval_batch_size=8)
    model = GPTLightning(GPTConfig(context_length=32, emb_dim=32, n_layers=N_LAYERS, n_heads=2))
    logger = TensorBoardLogger(tmp_path, name="tiny", default_hp_metric=False)
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        logger=logger,
        callbacks=callbacks,
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=1,
        **QUIET_TRAINER,
        log_every_n_steps=2,
        gradient_clip_val=CLIP,
    )
    trainer.fit(model, data)
    return trainer, model, data


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The fitted trainer, its module and data, and the run's event file."""
    tmp_path = tmp_path_factory.mktemp("fit")
    callbacks = [
        BlockGradNorms(),
        PositionSimilarity(num_sequences=2),
        UnigramBaseline(),
        ChapterFigures(),
        Samples(PROMPTS, max_new_tokens=NEW_TOKENS),
        RunsTable(),
    ]
    trainer, model, data = fit_tiny(tmp_path, callbacks)
    logger = trainer.logger
    acc = EventAccumulator(logger.log_dir, size_guidance={SCALARS: 0, TENSORS: 0, IMAGES: 0})
    acc.Reload()
    return trainer, model, data, acc


@pytest.fixture(scope="module")
def events(run) -> EventAccumulator:
    return run[3]


def steps(events: EventAccumulator, tag: str) -> list[int]:
    return [e.step for e in events.Scalars(tag)]


def values(events: EventAccumulator, tag: str) -> list[float]:
    return [e.value for e in events.Scalars(tag)]


def test_gradient_norm_of_every_block_on_logging_steps_only(events):
    tags = sorted(t for t in events.Tags()[SCALARS] if t.startswith("grad_norm/"))
    assert tags == [f"grad_norm/block_{i}" for i in range(1, N_LAYERS + 1)]
    for tag in tags:  # their values, block by block: test_answers.py, against gradients computed by hand
        assert steps(events, tag) == [1, 3], tag  # 4 steps (0-3), log_every_n_steps=2: Lightning logs steps 1 and 3


def test_the_epoch_losses_are_cross_entropy_over_each_sets_windows(run):
    """limit_val_batches=1: loss/val and loss/train are over the first 8 windows of each set, by hand here."""
    _, module, data, events = run
    model = module.model.eval()
    for ids, tag in ((data.val_set.ids, "loss/val"), (data.train_set.ids, "loss/train")):
        x, y = windows_by_hand(ids, 32, 128)  # TimeMachineData's default stride: 128
        with torch.no_grad():
            loss = F.cross_entropy(model(x[:8]).flatten(0, 1), y[:8].flatten()).item()
        assert values(events, tag)[-1] == pytest.approx(loss, abs=1e-5), tag


def test_every_tag_of_an_epochs_end_shares_the_step_of_the_validation_loss(events):
    assert steps(events, "loss/val") == EPOCH_ENDS and steps(events, "loss/train") == EPOCH_ENDS
    assert steps(events, "loss/val_best") == EPOCH_ENDS
    for tag in ["similarity/positions", *(f"similarity/block_{i}" for i in range(1, N_LAYERS + 1))]:
        assert steps(events, tag) == [0, *EPOCH_ENDS], tag  # at the start, then with each epoch's losses
    for tag in events.Tags()[IMAGES]:
        assert [e.step for e in events.Images(tag)] == EPOCH_ENDS, tag
    for prompt in PROMPTS:
        assert [e.step for e in events.Tensors(f"samples/{prompt}/text_summary")] == [0, *EPOCH_ENDS]


def by_hand_block_similarities(module: GPTLightning, idx: torch.Tensor) -> list[float]:
    """Embeddings, then the blocks one by one, in eval mode: the similarity between positions after each."""
    gpt = module.model.eval()
    with torch.no_grad():
        x = gpt.tok_emb(idx) + gpt.pos_emb(torch.arange(idx.shape[1]))
        sims = []
        for block in gpt.blocks:
            x = block(x)
            sims.append(position_similarity(x).mean().item())
    return sims


def test_similarity_after_every_block_the_last_is_the_top_of_the_stack(run):
    _, module, data, events = run
    tags = sorted(t for t in events.Tags()[SCALARS] if t.startswith("similarity/block_"))
    assert tags == [f"similarity/block_{i}" for i in range(1, N_LAYERS + 1)]
    top = values(events, "similarity/positions")
    assert values(events, f"similarity/block_{N_LAYERS}") == top  # block N's output is the top of the stack
    assert all(-1.0 <= v <= 1.0 for tag in tags for v in values(events, tag))
    # After training, the same 2 validation windows through the blocks by hand give the last logged values.
    expected = by_hand_block_similarities(module, torch.stack([data.val_set[i][0] for i in range(2)]))
    assert [values(events, tag)[-1] for tag in tags] == pytest.approx(expected, abs=1e-5)


def test_unigram_baseline_is_the_entropy_of_the_books_token_frequencies(events):
    ids = get_tokenizer().encode(load_book(default_data_dir()))
    n = len(ids)
    entropy = -math.fsum(c / n * math.log(c / n) for c in Counter(ids).values())
    logged = values(events, "loss/unigram_baseline")
    # at the start, then beside each epoch's losses: as many points as theirs, so TensorBoard's outlier-ignoring
    # scale (on by default) keeps the losses in view
    assert steps(events, "loss/unigram_baseline") == [0, *EPOCH_ENDS] == [0, *steps(events, "loss/val")]
    assert all(v == pytest.approx(entropy, abs=1e-6) for v in logged)
    assert abs(entropy - 6.346) < 0.01  # the chapter prints 6.346 for its copy of the book


def custom_scalar_charts(events: EventAccumulator) -> dict[str, list[str]]:
    layout = layout_pb2.Layout()
    layout.ParseFromString(events.Tensors(metadata.CONFIG_SUMMARY_TAG)[0].tensor_proto.string_val[0])
    return {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}


def test_each_custom_scalars_chart_draws_exactly_the_tags_it_names(events):
    charts = custom_scalar_charts(events)
    blocks = range(1, N_LAYERS + 1)
    wanted = {
        "loss (whole sets, per epoch) and the unigram floor": {"loss/train", "loss/val", "loss/unigram_baseline"},
        "training loss per step (with dropout) and the unigram floor": {"loss/train_step", "loss/unigram_baseline"},
        "gradient norm of each block's ffn.fc.weight": {f"grad_norm/block_{i}" for i in blocks},
        "similarity between positions after each block": {f"similarity/block_{i}" for i in blocks},
    }
    assert set(charts) == set(wanted)
    scalars = events.Tags()[SCALARS]
    for title, patterns in charts.items():
        # TensorBoard searches each pattern anywhere in each tag, as re.search does
        drawn = {tag for tag in scalars if any(re.search(p, tag) for p in patterns)}
        assert drawn == wanted[title], title
    per_epoch = charts["loss (whole sets, per epoch) and the unigram floor"]
    assert not any(re.search(p, "loss/train_step") for p in per_epoch)


def test_the_chapters_three_figures_are_images_every_epoch(run):
    trainer, _, _, events = run
    figures = sorted(t for t in events.Tags()[IMAGES] if t.startswith("figures/"))
    assert figures == ["figures/grad_norm_by_block", "figures/losses", "figures/similarity_by_block"]
    for tag in figures:
        image = events.Images(tag)[-1]
        pixels = matplotlib.image.imread(io.BytesIO(image.encoded_image_string), format="png")  # a real PNG
        assert pixels.shape[:2] == (image.height, image.width) == (400, 700), tag
        assert [e.step for e in events.Images(tag)] == EPOCH_ENDS, tag


def test_the_callbacks_order_does_not_change_the_figures(run, tmp_path):
    """The same fit with the figures' callbacks listed the other way round draws the same images at the same steps
    (each instrument draws its own figure; none reads another's values)."""
    callbacks = [ChapterFigures(), UnigramBaseline(), PositionSimilarity(num_sequences=2), BlockGradNorms()]
    trainer, _, _ = fit_tiny(tmp_path, callbacks)
    reversed_run = EventAccumulator(trainer.logger.log_dir, size_guidance={IMAGES: 0})
    reversed_run.Reload()
    tags = sorted(t for t in reversed_run.Tags()[IMAGES] if t.startswith("figures/"))
    assert tags == ["figures/grad_norm_by_block", "figures/losses", "figures/similarity_by_block"]
    for tag in tags:
        got = [(e.step, e.encoded_image_string) for e in reversed_run.Images(tag)]
        assert got == [(e.step, e.encoded_image_string) for e in run[3].Images(tag)], tag


def last_figure(run, kind: type):
    """The figure the run's ``kind`` callback drew last (one figure per chart, drawn again each validation)."""
    [callback] = [cb for cb in run[0].callbacks if isinstance(cb, kind)]
    return callback.chart.fig


def test_the_loss_figure_draws_the_logged_training_and_validation_losses_and_the_floor(run, events):
    ax = last_figure(run, ChapterFigures).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"with residuals, train", "with residuals, validation", "unigram floor 6.350"}
    train, val = lines["with residuals, train"], lines["with residuals, validation"]
    assert list(train.get_xdata()) == EPOCH_ENDS and list(val.get_xdata()) == EPOCH_ENDS
    assert list(train.get_ydata()) == pytest.approx(values(events, "loss/train"), abs=1e-6)
    assert list(val.get_ydata()) == pytest.approx(values(events, "loss/val"), abs=1e-6)
    assert train.get_linestyle() == "-" and val.get_linestyle() == "--"  # the chapter's: train solid, val dashed
    floor = values(events, "loss/unigram_baseline")[0]
    assert list(lines["unigram floor 6.350"].get_ydata()) == pytest.approx([floor, floor], abs=1e-6)


def test_the_grad_norm_figure_draws_each_blocks_last_logged_norm_in_block_order(run, events):
    [line] = last_figure(run, BlockGradNorms).axes[0].get_lines()
    assert list(line.get_xdata()) == list(range(1, N_LAYERS + 1))
    logged = [values(events, f"grad_norm/block_{i}")[-1] for i in range(1, N_LAYERS + 1)]
    assert list(line.get_ydata()) == pytest.approx(logged, abs=1e-6)


def test_the_similarity_figure_draws_one_line_per_epoch_so_far_in_block_order(run, events):
    lines = last_figure(run, PositionSimilarity).axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["start", "epoch 0", "epoch 1"]  # counted from 0
    for i, line in enumerate(lines):  # the start, then each epoch's end
        assert list(line.get_xdata()) == list(range(1, N_LAYERS + 1))
        logged = [values(events, f"similarity/block_{b}")[i] for b in range(1, N_LAYERS + 1)]
        assert list(line.get_ydata()) == pytest.approx(logged, abs=1e-6)


def test_the_text_tab_holds_each_prompts_greedy_continuation(run):
    _, module, _, events = run
    enc = get_tokenizer()
    for prompt in PROMPTS:
        logged = [e.tensor_proto.string_val[0].decode() for e in events.Tensors(f"samples/{prompt}/text_summary")]
        # The trained model, continued greedily by the chapter's generate, wrote the last epoch's entry.
        out = generate(module.model, torch.tensor([enc.encode(prompt)]), NEW_TOKENS)
        text = enc.decode(out[0].tolist())
        assert len(text) > len(prompt)
        assert logged[-1] == f"**{prompt}** →\n\n    {text.replace(chr(10), '↵')}"  # line breaks shown as ↵


def test_samples_leave_the_training_mode_and_the_random_state_as_they_were():
    module = GPTLightning(GPTConfig(vocab_size=50257, context_length=16, emb_dim=16, n_layers=1, n_heads=2))
    module.train()
    torch.manual_seed(0)
    before, threads = torch.get_rng_state(), torch.get_num_threads()
    texts = Samples(["I saw"], max_new_tokens=3).continuations(module)
    assert module.training and module.model.training and all(m.training for m in module.modules())
    assert torch.equal(torch.get_rng_state(), before) and torch.get_num_threads() == threads
    assert texts[0].startswith("I saw") and len(get_tokenizer().encode(texts[0])) == 2 + 3


def scrambled_module(context_length: int = 16) -> GPTLightning:
    """A small GPT with weights drawn at std 0.5: its logits differ from position to position and prompt to prompt."""
    module = GPTLightning(GPTConfig(vocab_size=50257, context_length=context_length, emb_dim=16, n_layers=2, n_heads=2))
    with torch.no_grad():
        for p in module.model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
    return module.eval()


def test_samples_of_prompts_of_different_lengths_equal_each_prompt_continued_alone():
    # All prompts continue in one batch; each must read as the chapter's generate on that prompt alone, also once
    # the longest outgrows the 16-token context and generate crops it on the left.
    module = scrambled_module()
    prompts = ["I saw", "The Time Traveller (for so it will be convenient to speak of him)", "The Time Traveller"]
    enc = get_tokenizer()
    alone = [enc.decode(generate(module.model, torch.tensor([enc.encode(p)]), 12)[0].tolist()) for p in prompts]
    assert len({len(enc.encode(p)) for p in prompts}) == 3 and len(enc.encode(prompts[1])) + 12 > 16
    assert Samples(prompts, max_new_tokens=12).continuations(module) == alone


def hparams_data(events: EventAccumulator, tag: str, parse):
    return parse(events.PluginTagToContent(hp_metadata.PLUGIN_NAME)[tag])


def test_the_hparams_tab_holds_the_runs_settings_and_its_final_losses(run):
    trainer, _, _, events = run
    experiment = hparams_data(events, hp_metadata.EXPERIMENT_TAG, hp_metadata.parse_experiment_plugin_data)
    start = hparams_data(events, hp_metadata.SESSION_START_INFO_TAG, hp_metadata.parse_session_start_info_plugin_data)
    end = hparams_data(events, hp_metadata.SESSION_END_INFO_TAG, hp_metadata.parse_session_end_info_plugin_data)
    settings = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}  # a protobuf Value
    assert settings == {
        "n_layers": 3, "residual": True, "emb_dim": 32, "n_heads": 2, "dropout": pytest.approx(0.1),
        "lr": pytest.approx(4e-4), "batch_size": 4, "context_length": 32, "precision": "32-true",
        "seed_everything": 123, "data.seed": 123,
    }  # fmt: skip
    assert {h.name for h in experiment.hparam_infos} == set(settings)
    shown_first = {h.name for h in experiment.hparam_infos if h.differs}  # TensorBoard shows these columns first
    assert shown_first == {"n_layers", "residual", "lr", "precision", "seed_everything"}
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics == ["loss/train", "loss/val", "loss/val_best"]
    assert end.status == api_pb2.STATUS_SUCCESS
    # The table shows each metric's last scalar: for loss/val_best, the lowest validation loss.
    assert values(events, "loss/val_best") == pytest.approx([min(values(events, "loss/val")[: i + 1]) for i in (0, 1)])


def test_a_writer_closed_by_an_earlier_run_takes_the_next_runs_records(tmp_path):
    """Lightning closes a TensorBoard writer when a run of its Trainer ends; the Trainer's next run (``validate``
    then ``fit``) writes the runs table's rows into the file again, and nothing else."""
    from types import SimpleNamespace

    from gpt_lit.diagnostics.losses import add_summaries, session_end_summary

    logger = TensorBoardLogger(str(tmp_path), name="run")
    trainer = SimpleNamespace(is_global_zero=True, sanity_checking=False, loggers=[logger])
    assert logger.experiment.file_writer is not None  # the writer the first run wrote with
    logger.finalize("success")  # as at the end of `validate`
    add_summaries(trainer, session_end_summary(api_pb2.STATUS_SUCCESS))
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert events.Tags()["scalars"] == []
    assert list(events.PluginTagToContent(hp_metadata.PLUGIN_NAME)) == [hp_metadata.SESSION_END_INFO_TAG]


@pytest.mark.parametrize("norms", [[0.26, 0.15, 0.12, 0.115], [0.01, 0.05, 0.3, 0.9], [0.4, 0.4, 0.4, 0.4]])
def test_the_grad_norm_figures_step_label_covers_no_point(norms):
    """The label "training step N" sits in the axes' top left, where block 1's norm is when it is the largest."""
    from gpt_lit.diagnostics.figures import Chart, draw_grad_norms

    chart = Chart()
    draw_grad_norms(ax := chart.axes(legend=False), norms, 189)
    chart.fig.draw_without_rendering()  # the texts laid out
    [label] = ax.texts
    box = label.get_window_extent().padded(5)  # and a marker's radius (markersize 6 points: 4 pixels)
    for x, y in ax.transData.transform(list(zip(range(1, len(norms) + 1), norms, strict=True))):
        assert not box.contains(x, y), (norms, x, y)
