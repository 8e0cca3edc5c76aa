"""The Time Machine, found or downloaded, stripped of Gutenberg's header and licence, cut into windows."""

import threading
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler

import pytest
import torch
import yaml
from conftest import REPO, windows_by_hand

from gpt_lit import book_source
from gpt_lit.book_source import load_book
from gpt_lit.data import TimeMachineData, TokenWindows
from gpt_lit.errors import GptLitError
from gpt_lit.module import GPTLightning
from gpt_lit.run.cli import main
from gpt_lit.tokenizer import get_tokenizer


@pytest.fixture(scope="module")
def dm():
    dm = TimeMachineData()  # the shipped book
    dm.setup("fit")
    return dm


def test_book_is_stripped_and_normalised(book_path):
    text = load_book(book_path.parent)
    assert text.startswith("The Time Machine\n\nAn Invention\n\nby H. G. Wells")
    assert text.endswith("still lived on in the heart of man.")
    assert "\r" not in text and "Gutenberg" not in text[-2000:] and "*** START" not in text
    assert len(text) == 179_692


def test_the_chapters_windows(dm):
    assert len(dm.book_ids) == 45_260
    assert len(dm.train_set) == 316 and len(dm.val_set) == 37
    assert len(dm.train_dataloader()) == 19  # 316 // 16, drop_last
    x, y = dm.train_set[5]
    assert x.shape == y.shape == (128,)
    assert torch.equal(x[1:], y[:-1])  # targets are the inputs shifted by one token
    assert torch.equal(dm.train_set[1][0][:1], dm.train_set.ids[128:129])  # stride 128


def test_windows_every_stride_tokens_by_hand():
    ids = torch.arange(100, 120)  # 20 tokens
    # context 4, stride 3: a window needs 5 tokens (inputs and the target one further), so the last starts at 15
    ds = TokenWindows(ids, context_length=4, stride=3)
    assert [ds[i][0].tolist() for i in range(len(ds))] == [
        [100, 101, 102, 103], [103, 104, 105, 106], [106, 107, 108, 109],
        [109, 110, 111, 112], [112, 113, 114, 115], [115, 116, 117, 118],
    ]  # fmt: skip
    assert ds[5][1].tolist() == [116, 117, 118, 119]  # the last target ends on the last token
    # overlapping windows: stride 1 over 7 tokens, context 4 -> starts 0, 1, 2
    assert [x.tolist() for x, _ in TokenWindows(torch.arange(7), 4, 1)] == [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]


@pytest.mark.parametrize("n, count", [(4, 0), (5, 1), (6, 1), (9, 1), (10, 2)])
def test_a_text_of_exactly_context_plus_one_tokens_is_one_window(n, count):
    # context 4, stride 5: a window at 0 needs 5 tokens; the next, at 5, needs 10
    ds = TokenWindows(torch.arange(n), context_length=4, stride=5)
    assert len(ds) == count
    if count:
        x, y = ds[0]
        assert x.tolist() == [0, 1, 2, 3] and y.tolist() == [1, 2, 3, 4]


def test_data_stride_makes_overlapping_windows(dm):
    half = TimeMachineData(context_length=32, stride=16)
    half.setup("fit")
    x, y = windows_by_hand(half.train_set.ids, 32, 16)
    assert len(half.train_set) == len(x) == (len(half.train_set.ids) - 33) // 16 + 1
    assert torch.equal(torch.stack([half.train_set[i][0] for i in range(len(x))]), x)
    assert torch.equal(torch.stack([half.train_set[i][1] for i in range(len(y))]), y)
    assert torch.equal(half.train_set[1][0][:16], half.train_set[0][0][16:])  # each window overlaps the last by half
    vx, _ = windows_by_hand(half.val_set.ids, 32, 16)
    assert len(half.val_set) == len(vx) and torch.equal(half.val_set[len(vx) - 1][0], vx[-1])


def test_training_and_validation_text_are_the_chapters_90_10_split_with_no_overlap(dm, book_path):
    text = load_book(book_path.parent)
    # The chapter: train_ratio = 0.90, split_idx = int(train_ratio * len(text_data)): 0.9 * 179,692 = 161,722.8
    split = 161_722
    enc = get_tokenizer()
    assert enc.decode(dm.train_set.ids.tolist()) == text[:split]
    assert enc.decode(dm.val_set.ids.tolist()) == text[split:]
    assert torch.equal(dm.train_set.ids, torch.tensor(enc.encode(text[:split])))
    assert torch.equal(dm.val_set.ids, torch.tensor(enc.encode(text[split:])))
    # no training window (inputs or targets) reaches past the training text's tokens
    assert dm.train_set.starts[-1] + dm.context_length + 1 <= len(dm.train_set.ids)


def test_training_order_is_seeded_and_changes_each_epoch(dm):
    def first_batch(epoch):
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        return next(iter(loader))[0]

    assert torch.equal(first_batch(0), first_batch(0))
    assert not torch.equal(first_batch(0), first_batch(1))
    val = [x for x, _ in dm.val_dataloader()[0]]
    assert torch.equal(torch.cat(val), torch.stack([dm.val_set[i][0] for i in range(37)]))  # in order


def test_env_var_is_the_default_and_yaml_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("GPT_LIT_DATA_DIR", str(tmp_path / "env"))
    assert TimeMachineData().data_dir == str(tmp_path / "env")
    assert TimeMachineData(data_dir="elsewhere").data_dir == "elsewhere"
    monkeypatch.delenv("GPT_LIT_DATA_DIR")
    assert TimeMachineData().data_dir == str(book_source.SHIPPED_BOOK_DIR)


def test_missing_book_is_downloaded_atomically(tmp_path, book_path, monkeypatch):
    # A local HTTP server stands in for gutenberg.org.
    serve = tmp_path / "site"
    serve.mkdir()
    (serve / "pg35.txt").write_bytes(book_path.read_bytes())
    server = HTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(serve)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/pg35.txt"
        monkeypatch.setattr(book_source, "BOOK_URL", url)
        target = tmp_path / "data"
        assert len(load_book(target)) == 179_692
        assert (target / "pg35.txt").read_bytes() == book_path.read_bytes()
        assert [p.name for p in target.iterdir()] == ["pg35.txt"]  # no temporary file left behind
    finally:
        server.shutdown()


def test_no_file_and_no_network_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setattr(book_source, "BOOK_URL", "http://127.0.0.1:9/pg35.txt")  # nothing listens there
    with pytest.raises(GptLitError, match=r"not at .*pg35\.txt.*GPT_LIT_DATA_DIR"):
        load_book(tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(GptLitError, match="switched off"):
        load_book(tmp_path, download=False)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty"),
        (b"\xff\xfe\x00bad", "not UTF-8"),
        (b"just some text\r\nwithout markers\r\n", "START OF"),
    ],
)
def test_malformed_book(tmp_path, content, message):
    (tmp_path / "pg35.txt").write_bytes(content)
    with pytest.raises(GptLitError, match=message):
        load_book(tmp_path)


def test_book_too_short_for_one_window(tmp_path):
    (tmp_path / "pg35.txt").write_text("*** START OF X ***\r\nA few words only.\r\n*** END OF X ***\r\n")
    with pytest.raises(GptLitError, match="too few for one window"):
        TimeMachineData(data_dir=str(tmp_path)).setup("fit")


# --- what a reader changes about the data ---


def test_stride_follows_the_context_length_unless_given(capsys):
    short = TimeMachineData(context_length=32)  # data.stride: null, as the shipped configs say
    short.setup("fit")
    x, y = windows_by_hand(short.train_set.ids, 32, 32)
    assert len(short.train_set) == len(x) == 1265  # every token of the 40,508 but the last few, in windows
    assert torch.equal(torch.stack([short.train_set[i][0] for i in range(len(x))]), x)
    assert torch.equal(torch.stack([short.train_set[i][1] for i in range(len(y))]), y)
    assert capsys.readouterr().err == ""  # nothing skipped, nothing said


@pytest.mark.parametrize(
    "config", ["residual", "no_residual", "residual_8", "no_residual_8", "gpt2_124m", "gpt2_124m_finetune"]
)
def test_the_shipped_configs_cut_the_chapters_windows(config):
    data = yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text())["data"]
    assert "stride" in data and data["stride"] is None  # said, and left to follow the context length
    dm = TimeMachineData(context_length=data["context_length"], stride=data["stride"])
    assert dm.stride == data["context_length"]
    if config.startswith(("residual", "no_residual")):  # the chapter's: 316 windows of 128 tokens, one every 128
        dm.setup("fit")
        assert len(dm.train_set) == 316 and dm.train_set.starts[:3] == [0, 128, 256]


def test_a_stride_longer_than_the_context_says_how_much_text_the_windows_skip(capsys):
    sparse = TimeMachineData(context_length=32, stride=128)
    sparse.setup("fit")
    # Counted here: each window's input holds 32 tokens, and windows 128 apart never overlap.
    train, val = sparse.train_set, sparse.val_set
    train_skipped, val_skipped = len(train.ids) - 32 * len(train), len(val.ids) - 32 * len(val)
    assert (train_skipped, len(train.ids), val_skipped, len(val.ids)) == (30_364, 40_508, 3_568, 4_752)
    assert capsys.readouterr().err.splitlines() == [
        "note: data.stride=128 is longer than data.context_length=32: the windows skip 30,364 of the 40,508 "
        "training tokens (75%) and 3,568 of the 4,752 validation tokens (75%); leave data.stride unset (null) for "
        "windows that cover the text"
    ]


def test_gpt2s_special_token_in_the_book_and_in_a_prompt_is_the_same_ordinary_text(tmp_path):
    story = "The Time Traveller wrote <|endoftext|> on the wall. " * 40
    (tmp_path / "pg35.txt").write_text(f"*** START OF THE BOOK ***\n{story}\n*** END OF THE BOOK ***\n")
    line = "The Time Traveller wrote <|endoftext|> on the wall."
    dm = TimeMachineData(data_dir=str(tmp_path), context_length=32, batch_size=2, prompts=[line])
    dm.setup("fit")  # no tiktoken ValueError
    enc = get_tokenizer()
    assert enc.decode(dm.book_ids.tolist()) == story.strip()
    assert 50256 not in dm.book_ids.tolist()  # never GPT-2's special token: the characters as they are written
    prompt = dm.predict_dataloader().dataset.ids[0].tolist()
    assert len(prompt) == 16 and enc.decode(prompt) == line
    assert dm.book_ids.tolist()[: len(prompt)] == prompt  # the prompt's tokens are the book's


def test_a_prompts_file_is_split_on_line_ends_only_and_loses_its_byte_order_mark(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes("\ufeffThe Time Traveller\r\nI saw\x0cthe page\u2028turn\n\n  \nWeena\n".encode())
    dm = TimeMachineData(prompts_file=str(path))
    prompts = dm.predict_dataloader().dataset
    assert prompts.texts == ["The Time Traveller", "I saw\x0cthe page\u2028turn", "Weena"]
    assert prompts.ids[0].tolist() == get_tokenizer().encode("The Time Traveller")  # no extra tokens up front


def test_a_linked_key_in_a_config_file_is_the_command_lines_error(tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text("model:\n  config:\n    context_length: 64\ndata:\n  context_length: 32\n")
    errors = []
    for args in (["--config", str(config)], ["--model.config.context_length", "64"]):
        with pytest.raises(SystemExit) as stopped:
            main(["fit", "--config", "residual", *args, "--print_config"])
        assert stopped.value.code == 2
        errors.append(capsys.readouterr().err.strip().splitlines())
    message = 'error: Linked "model.config.context_length" must be given via "data.context_length".'
    assert errors == [
        [f"{message} (in {config}, line 3; --help lists the options)"],
        [f"{message} (from the command line: --model.config.context_length; --help lists the options)"],
    ]


def test_the_compile_option_says_it_changes_the_dropout_masks():
    help_text = " ".join(GPTLightning.__init__.__doc__.split())
    assert "compile: Run the model through ``torch.compile``" in help_text
    assert "draws its dropout masks its own way" in help_text and "with dropout 0" in help_text
