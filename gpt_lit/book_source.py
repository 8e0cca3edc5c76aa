"""The book: the copy that ships with gpt_lit, or another (downloaded when missing), stripped of Gutenberg's header."""

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from gpt_lit.errors import GptLitError, say

BOOK_URL = "https://www.gutenberg.org/cache/epub/35/pg35.txt"
BOOK_FILE = "pg35.txt"
DATA_DIR_ENV = "GPT_LIT_DATA_DIR"
# The shipped copy, which every number in the README comes from (Project Gutenberg's 2021 edition, CRLF line ends).
BOOK_SHA256 = "7fb3a97247192d3ddbe13be43d0359d8395db73b884f395c4b5f15f6931acba2"
SHIPPED_BOOK_DIR = Path(__file__).resolve().parent / "book"


def default_data_dir() -> str:
    """``$GPT_LIT_DATA_DIR`` when set, else the folder of the book that ships with gpt_lit."""
    return os.environ.get(DATA_DIR_ENV) or str(SHIPPED_BOOK_DIR)


def download_book(path: Path) -> None:
    """Fetch the book into ``path`` atomically: a temporary file in the same folder, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(BOOK_URL, timeout=30.0) as response:
            out.write(response.read())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def strip_gutenberg(raw: str, source: str = "the book") -> str:
    """The text between the ``*** START OF`` and ``*** END OF`` lines, ``\\n`` line ends, blank lines trimmed."""
    start, end = raw.find("*** START OF"), raw.find("*** END OF")
    if start < 0 or end < 0 or end < start:
        raise GptLitError(
            f"{source} has no '*** START OF' / '*** END OF' lines: it is not Project Gutenberg's pg35.txt. "
            f"Replace it with the file from {BOOK_URL}"
        )
    start = raw.find("\n", start) + 1  # the text begins on the line after the START line
    text = raw[start:end].replace("\r\n", "\n").replace("\r", "\n").strip()
    if not text:
        raise GptLitError(f"{source} has no text between its START and END lines; replace it with {BOOK_URL}")
    return text


def ensure_book(data_dir: str | os.PathLike, download: bool = True) -> Path:
    """The path of ``pg35.txt`` in ``data_dir``, downloading it there first if it is missing."""
    path = Path(data_dir) / BOOK_FILE
    if not path.is_file():
        reason = "downloading is switched off (data.download: false)"
        if download:
            try:
                download_book(path)
            except (OSError, urllib.error.URLError) as e:
                reason = f"downloading {BOOK_URL} failed ({getattr(e, 'reason', e)})"
        if not path.is_file():
            raise GptLitError(
                f"The Time Machine is not at {path} and {reason}. Download {BOOK_URL} and save it as {path}, "
                f"or point data.data_dir (or ${DATA_DIR_ENV}) at the folder that holds {BOOK_FILE}."
            )
    return path


def load_book(data_dir: str | os.PathLike, download: bool = True) -> str:
    """The story in ``data_dir``'s ``pg35.txt`` (downloaded first if missing); another copy after a one-line warning."""
    path = ensure_book(data_dir, download)
    try:
        data = path.read_bytes()
        raw = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GptLitError(f"{path} is not UTF-8 text (byte {e.start}); replace it with {BOOK_URL}") from None
    except OSError as e:
        raise GptLitError(f"cannot read {path}: {e.strerror}") from None
    if not raw.strip():
        raise GptLitError(f"{path} is empty; delete it to download the book again, or replace it with {BOOK_URL}")
    text = strip_gutenberg(raw, source=str(path))
    digest = hashlib.sha256(data).hexdigest()
    if digest != BOOK_SHA256:  # used all the same, after one line
        say(
            "warning",
            f"{path} is another copy of The Time Machine than the one the README's numbers come from (sha256 "
            f"{digest[:16]}..., not {BOOK_SHA256[:16]}...): token counts, the unigram floor and the losses will "
            f"differ; leave data.data_dir and ${DATA_DIR_ENV} unset to use the copy gpt_lit ships",
        )
    return text
