"""The book ships with gpt_lit: the exact file the README's numbers come from; another copy is used after a warning."""

import hashlib

from gpt_lit.book_source import SHIPPED_BOOK_DIR, load_book
from gpt_lit.data import TimeMachineData

# Project Gutenberg's pg35.txt, 2021 edition, as served then: 204,452 bytes, CRLF line ends.
README_BOOK_SHA256 = "7fb3a97247192d3ddbe13be43d0359d8395db73b884f395c4b5f15f6931acba2"


def test_the_shipped_book_is_the_readme_s_copy_with_its_licence(book_path):
    raw = book_path.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == README_BOOK_SHA256 and len(raw) == 204_452
    assert raw.count(b"\r\n") == raw.count(b"\n")  # git kept Gutenberg's line ends (.gitattributes)
    assert b"Project Gutenberg License" in raw and b"*** END OF THE PROJECT GUTENBERG EBOOK" in raw


def test_the_shipped_book_is_the_default_with_no_network(monkeypatch, capsys):
    monkeypatch.delenv("GPT_LIT_DATA_DIR", raising=False)
    data = TimeMachineData()
    assert data.data_dir == str(SHIPPED_BOOK_DIR)
    assert len(load_book(data.data_dir, download=False)) == 179_692
    assert capsys.readouterr().err == ""  # no warning for the shipped copy


def test_another_copy_is_used_after_one_warning_line(tmp_path, book_path, capsys):
    # The same book with "\n" line ends (as a text-mode download or a git checkout may leave it): same story,
    # other bytes.
    (tmp_path / "pg35.txt").write_bytes(book_path.read_bytes().replace(b"\r\n", b"\n"))
    text = load_book(tmp_path, download=False)
    assert text == load_book(book_path.parent)  # the run goes on, with this copy
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {tmp_path / 'pg35.txt'} is another copy of The Time Machine")
    other = hashlib.sha256((tmp_path / "pg35.txt").read_bytes()).hexdigest()
    assert f"sha256 {other[:16]}..., not {README_BOOK_SHA256[:16]}..." in err[0]


def test_an_exact_copy_elsewhere_gives_no_warning(tmp_path, book_path, capsys):
    (tmp_path / "pg35.txt").write_bytes(book_path.read_bytes())
    load_book(tmp_path, download=False)
    assert "warning" not in capsys.readouterr().err
