"""The docs (README.md, docs/*.md) against the code: what they quote must be what the software says and has.

- Every ``error:`` / ``warning:`` line they quote is made of the messages in the code that prints it: each stretch
  of its text is a literal part of one of those messages (gpt_lit's, or of jsonargparse's and Lightning's that
  the CLI passes on, or an OS / PyTorch / YAML message produced here), and what is left is values (paths,
  numbers, names) or the docs' ``…``. A changed word fails.
- Every ``--a.b`` option they mention is one the CLI's parser has (its ``--help``).
- docs/development.md's layout table lists exactly the repository's files, one a line.
- The defaults of the speed options' table are the options' defaults.
- A measured time (``N s``, ``N min N s``) appears on one page only; other pages link to it.
"""

import ast
import contextlib
import errno
import io
import os
import re
import subprocess
from functools import cache
from pathlib import Path

import jsonargparse
import lightning.pytorch
import pytest
from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The code whose messages the CLI prints: gpt_lit's own, and the few of its dependencies' it passes on.
SITE = Path(jsonargparse.__file__).parent, Path(lightning.pytorch.__file__).parent
MESSAGE_SOURCES = [
    *sorted((REPO / "gpt_lit").rglob("*.py")),
    SITE[0] / "_core.py",  # "Subcommand 'fit' does not accept option ..."
    SITE[0] / "_link_arguments.py",  # 'Linked "..." must be given via "..."'
    SITE[1] / "trainer" / "connectors" / "accelerator_connector.py",  # an accelerator or strategy that cannot run
]
# Words a quoted line may hold as values (a subcommand, --ckpt_path's names, JSON values); any other plain
# lowercase word must come from a message's text.
# (a word in quotes is a value too)
VALUE_WORDS = {"fit", "validate", "test", "predict", "export", "last", "best", "true", "false", "null", "nan"}
VALUE_WORDS |= {"fsdp", "ddp", "cpu", "cuda", "mps"} | {p.stem for p in (REPO / "configs").glob("*.yaml")}


def quoted_lines(pattern: str) -> list[tuple[str, str]]:
    """(file:line, text) of every line of the docs that starts with ``pattern`` inside backticks or a code block."""
    found = []
    for doc in DOCS:
        in_block = False
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
            if line.startswith("```"):
                in_block = not in_block
                continue
            where = f"{doc.relative_to(REPO)}:{number}"
            if in_block and line.startswith(pattern):
                found.append((where, line))
            # inline code: `error: ...` (double backticks when the line itself holds one)
            for match in re.finditer(rf"(``?)({re.escape(pattern)}.*?)\1(?!`)", line):
                found.append((where, match[2].strip()))
    return found


def literal_parts(file: Path) -> set[str]:
    """The literal text of every string and f-string in ``file``, cut at each ``{...}`` of an f-string."""
    parts: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.JoinedStr):
            parts |= {v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.add(node.value)
    return {p.strip("\n") for p in parts if re.search(r"[A-Za-z]", p)}


def library_messages() -> set[str]:
    """Messages that come from the OS, PyTorch's C++ or PyYAML, produced here as a run produces them."""
    import torch
    import yaml

    messages = {os.strerror(errno.ENOSPC), os.strerror(errno.ENOTDIR), os.strerror(errno.ENOENT)}
    try:
        yaml.safe_load("[1, 2")
    except yaml.YAMLError as e:
        messages.add(e.problem)
    bad = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpt_lit_docs_{os.getpid()}.ckpt"
    bad.write_bytes(b"PK\x03\x04 not a zip archive")
    try:
        torch.load(bad, weights_only=True)
    except Exception as e:  # PytorchStreamReader's message
        messages.add(str(e).split(". ")[0])
    finally:
        bad.unlink()
    from safetensors import safe_open
    from safetensors.torch import save_file

    bad = bad.with_suffix(".safetensors")
    save_file({"w": torch.zeros(4)}, str(bad))
    bad.write_bytes(bad.read_bytes()[:-8])  # a download that stopped half way
    try:
        safe_open(str(bad), framework="pt")
    except Exception as e:
        messages.add(str(e))
    finally:
        bad.unlink()
    return messages


@cache
def message_parts() -> list[str]:
    sources = [f for f in MESSAGE_SOURCES if f.is_file()]  # a dependency's version may lay its files out otherwise
    parts = set().union(*(literal_parts(f) for f in sources)) | library_messages()
    return sorted(parts, key=len, reverse=True)


def cover(line: str) -> list[bool]:
    """Which characters of ``line`` a message's literal text covers. Where the docs shorten a message with an
    ellipsis (``…`` or ``...``, which covers anything), the text beside it may be the start or the end of a part."""
    covered = [False] * len(line)

    def mark(start: int, end: int) -> None:
        covered[start:end] = [True] * (end - start)

    parts = [p for p in message_parts() if len(p.strip()) >= 2]
    for part in parts:
        start = line.find(part)
        while start >= 0:
            mark(start, start + len(part))
            start = line.find(part, start + 1)
    cuts = [(m.start(), m.end()) for m in re.finditer(r"…|\.\.\.", line)]
    for start, end in cuts:
        mark(start, end)
    bounds = [0, *[x for cut in cuts for x in cut], len(line)]
    for start, end in zip(bounds[::2], bounds[1::2], strict=True):  # the text between two ellipses
        segment = line[start:end]
        if end < len(line):  # an ellipsis follows: the segment may end with the start of a part
            n = max((k for k in range(4, len(segment) + 1) if any(p.startswith(segment[-k:]) for p in parts)),
                    default=0)  # fmt: skip
            mark(end - n, end)
        if start > 0:  # an ellipsis precedes: the segment may start with the end of a part
            n = max((k for k in range(4, len(segment) + 1) if any(p.endswith(segment[:k]) for p in parts)),
                    default=0)  # fmt: skip
            mark(start, start + n)
    return covered


def uncovered(line: str) -> list[str]:
    """The words of ``line`` that no message's text covers and that are not values: a plain lowercase word
    (not a path, number, option or name) must come from a message."""
    covered = cover(line)
    words = []
    for match in re.finditer(r"[^\s.,;:()\[\]](?:\S*[^\s.,;:()\[\]])?", line):  # words, without punctuation around
        word = match[0]
        if not all(covered[match.start() : match.end()]) and re.fullmatch(r"[a-z]+", word) and word not in VALUE_WORDS:
            words.append(word)
    return words


ERROR_LINES = quoted_lines("error: ") + quoted_lines("warning: ")


def test_the_docs_quote_error_lines():
    assert len(ERROR_LINES) > 30  # the search finds them (errors.md's table, gpt2.md's, ...)


@pytest.mark.parametrize("where, line", ERROR_LINES, ids=[w for w, _ in ERROR_LINES])
def test_every_quoted_error_line_is_what_the_code_prints(where, line):
    words = uncovered(line)
    assert not words, f"{where}: {words} in {line!r} are in no message of the code"


def dotted_options() -> dict[str, str]:
    """Every ``--a.b`` option the docs mention, with where (the first place)."""
    found: dict[str, str] = {}
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
            if "must be given via" in line or "unrecognized arguments: " in line:  # the error lines for an option
                # that is linked, not given, and for one that does not exist
                continue
            for option in re.findall(r"(?<![\w-])--[a-z_]+(?:\.[a-z_0-9]+)+", line):
                found.setdefault(option.rstrip("."), f"{doc.relative_to(REPO)}:{number}")
    return found


@pytest.fixture(scope="module")
def help_text() -> str:
    """The CLI parser's --help: fit's and export's, and the default logger's (an ``init_args`` option is one of
    the logger class's)."""
    from gpt_lit.run.cli import main

    texts = []
    for args in (["fit", "--help"], ["export", "--help"],
                 ["fit", "--trainer.logger.help", "lightning.pytorch.loggers.TensorBoardLogger"]):  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
            main(args)
        texts.append(out.getvalue())
    return "\n".join(texts)


@pytest.fixture(scope="module")
def help_options(help_text) -> set[str]:
    return set(re.findall(r"--[\w.]+", help_text))


def test_every_option_the_docs_mention_exists(help_options):
    options = dotted_options()
    assert len(options) > 20
    missing = {}
    for option, where in options.items():
        # --trainer.logger.init_args.version: the logger class's --version, listed as --trainer.logger.version
        if option.replace(".init_args.", ".") not in help_options:
            missing[option] = where
    assert not missing, f"options the docs mention that --help does not have: {missing}"


def layout_rows() -> list[str]:
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    table = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return [row for row in table.splitlines() if row.startswith("| `")]


def test_the_layout_table_lists_every_file_once():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    listed = []
    for row in layout_rows():
        paths = re.findall(r"`([^`]+)`", row.split("|")[1])
        assert len(paths) == 1, f"one file a line: {row}"
        listed.append(paths[0])
    assert len(listed) == len(set(listed)), "a file listed twice"
    assert set(listed) == set(files.split()), (
        f"missing: {sorted(set(files.split()) - set(listed))}; not files: {sorted(set(listed) - set(files.split()))}"
    )


def test_each_measured_time_is_on_one_page():
    pages: dict[str, set[str]] = {}
    for doc in DOCS:
        for time in re.findall(r"\b(\d+(?:\.\d+)? min \d+ s|\d{2,}(?:\.\d+)? s)\b", doc.read_text(encoding="utf-8")):
            pages.setdefault(time, set()).add(doc.name)
    twice = {time: sorted(where) for time, where in pages.items() if len(where) > 1}
    assert not twice, f"measured times on more than one page (keep one, link to it): {twice}"


def test_the_documented_defaults_are_the_options_defaults(help_text):
    """performance.md's table of speed options gives each ``model.*`` option's default."""
    rows = re.findall(r"^\| `(model\.\w+)` \| `([^`]+)` \|", (REPO / "docs" / "performance.md").read_text(), re.M)
    assert len(rows) >= 4
    for option, documented in rows:
        block = help_text.split(f"\n  --{option} ", 1)[1].split("\n  --", 1)[0]  # its entry, not the usage line
        default = re.search(r"default: (\S+?)\)", " ".join(block.split()))[1]
        assert default.lower() == documented, f"docs/performance.md: {option} defaults to {default}, not {documented}"


def test_no_page_types_a_count_of_the_suites_tests():
    """Each test added changes the count: the docs say how to count them (``--collect-only``), not how many."""
    typed = {doc.name: re.findall(r"\b\d{3,} tests\b", doc.read_text(encoding="utf-8")) for doc in DOCS}
    assert not any(typed.values()), f"test counts typed in the docs: {typed}"


def test_the_checkpoint_size_is_the_chapters_parameters_three_times_in_fp32():
    """Weights and AdamW's two moments, 4 bytes each: the size in MB; the run's state adds bytes that vary by run, so
    no page gives it to the byte."""
    from gpt_lit.model import GPT, GPTConfig

    chapter = GPTConfig(context_length=128, emb_dim=256, n_layers=4, n_heads=4)  # configs/residual.yaml's
    megabytes = round(3 * 4 * sum(p.numel() for p in GPT(chapter).parameters()) / 1e6)
    assert f"A checkpoint of the chapter's model is {megabytes} MB" in (REPO / "docs" / "performance.md").read_text()
    to_the_byte = {doc.name: re.findall(r"\b\d{3},\d{3},\d{3} bytes", doc.read_text(encoding="utf-8")) for doc in DOCS}
    assert not any(to_the_byte.values()), to_the_byte


def test_fused_loss_help_gives_evaluations_tiles(help_text):
    """``vocab_blocked_token_losses`` evaluates tiles of TILE_TOKENS tokens by TILE_WORDS words; the help says so."""
    from gpt_lit.loss import TILE_TOKENS, TILE_WORDS

    entry = " ".join(help_text.split("\n  --model.fused_loss ", 1)[1].split("\n  --", 1)[0].split())
    assert f"evaluation in tiles of {TILE_TOKENS} tokens x {TILE_WORDS} words" in entry
