"""docs/tensorboard.md against a run of a shipped config: its table lists exactly the tags a `fit` and a `test` log,
each tag holds the number of points the table's *points* column gives for the run's epochs and steps, and the
images are the sizes the page states.

The run is configs/residual.yaml with every diagnostic, a tiny model with the chapter's 4 heads (the attention
images' size depends on the heads and the sentence's 24 tokens, not on the width or the depth), 2 epochs of
3 training steps and evaluation batches of 8 windows, 5 of each set (``Throughput``'s rates start at the 5th).
"""

import re

import pytest
from conftest import REPO, TINY

DOC = REPO / "docs" / "tensorboard.md"
EPOCHS, STEPS = 2, 2 * 3
RUN = [
    "--config", "residual.yaml", *TINY, "--model.config.n_heads", "4", "--data.eval_batch_size", "8",
    "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "5",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip


def table() -> list[tuple[list[str], str]]:
    """Each row of the page's tag table (the one whose first column is ``tag``): (its tags and patterns, its
    points cell, "" without that column)."""
    lines = ("| tag |" + DOC.read_text(encoding="utf-8").split("\n| tag |", 1)[1]).split("\n\n", 1)[0].splitlines()
    header = [cell.strip() for cell in lines[0].split("|")[1:-1]]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[2:]]  # after the | --- | line
    column = header.index("points") if "points" in header else None
    return [(re.findall(r"`([^`]+)`", row[0]), row[column] if column else "") for row in rows]


def matches(pattern: str, tag: str) -> bool:
    """The page's patterns: ``N`` a number, ``<prompt>`` a prompt, ``*`` one name (no ``/``)."""
    regex = re.escape(pattern).replace("N", r"\d+").replace("<prompt>", ".+").replace(r"\*", "[^/]+")
    return re.fullmatch(regex, tag) is not None


def points(cell: str) -> int | None:
    """The points cell's count for the run (`epochs`, `epochs + 1`, `steps - 4`, `1`), None where it is in words."""
    formula = re.fullmatch(r"`(epochs|steps|\d+)(?: ([+-]) (\d+))?`", cell)
    if formula is None:
        return None
    base, sign, n = formula.groups()
    count = {"epochs": EPOCHS, "steps": STEPS}.get(base) or int(base)
    return count + int(n or 0) * (-1 if sign == "-" else 1)


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> dict[str, list]:
    """Every tag the run's `fit` and its `test` on last.ckpt log, each with its events (scalars, images, texts)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpt_lit.run.cli import main

    root = tmp_path_factory.mktemp("tensorboard_docs")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # lightning_logs/ goes here, as in a reader's folder
        main(["fit", *RUN, "--trainer.max_epochs", str(EPOCHS)])
        main(["test", *RUN, "--ckpt_path", "last"])
    version = root / "lightning_logs" / "residual" / "version_0"
    events: dict[str, list] = {}
    for folder in (version, version / "test" / "last"):
        run = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
        run.Reload()
        for tag in run.Tags()["scalars"]:
            events.setdefault(tag, []).extend(run.Scalars(tag))
        events.update({tag: run.Images(tag) for tag in run.Tags()["images"]})
        texts = [tag for tag in run.Tags()["tensors"] if run.SummaryMetadata(tag).plugin_data.plugin_name == "text"]
        events.update({tag: run.Tensors(tag) for tag in texts})
    return events


def test_the_table_lists_every_tag_a_run_logs_and_only_those(logged):
    patterns = [pattern for tags, _ in table() for pattern in tags]
    assert len(patterns) > 30
    unlisted = sorted(tag for tag in logged if not any(matches(p, tag) for p in patterns))
    not_logged = sorted(p for p in patterns if not any(matches(p, tag) for tag in logged))
    assert not unlisted, f"docs/tensorboard.md's table lacks tags a run logs: {unlisted}"
    assert not not_logged, f"docs/tensorboard.md's table lists tags no run logs: {not_logged}"


def test_each_tag_holds_the_points_the_table_gives(logged):
    checked = set()
    for tags, cell in table():
        count = points(cell)
        for pattern in tags if count is not None else ():
            for tag in (tag for tag in logged if matches(pattern, tag)):
                assert len(logged[tag]) == count, f"{tag}: {len(logged[tag])} points, the table says {cell}"
                checked.add(tag)
    images = {tag for tag, events in logged.items() if hasattr(events[0], "encoded_image_string")}
    assert images and images <= checked, f"images without a count in the table: {sorted(images - checked)}"
    # The page's n-epoch run draws n + 1 images of some tags: the table's largest count of images for n epochs.
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    n, drawn = map(int, re.search(r"a (\d+)-epoch run draws (\d+) images", text).groups())
    assert drawn == max(len(logged[tag]) for tag in images) + n - EPOCHS


def test_the_images_are_the_sizes_the_page_states(logged):
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    figures = re.search(r"The `figures/\*` images are (\d+) x (\d+) pixels", text)
    attention = re.search(r"the `attention/block_N` images (\d+) x (\d+) with the chapter's (\d+) heads", text)
    assert figures and attention
    assert int(attention[3]) == 4  # the run's heads, configs/residual.yaml's
    for tag, events in logged.items():
        stated = figures if tag.startswith("figures/") else attention if tag.startswith("attention/block_") else None
        for event in events if stated else ():
            assert (event.width, event.height) == (int(stated[1]), int(stated[2])), tag
