"""The Time Machine as a LightningDataModule: the book cut into training and validation windows, their loaders (each
epoch's order: ``gpt_lit.epoch_order``) and ``predict``'s prompts (``gpt_lit.prompts``)."""

import multiprocessing
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset

from gpt_lit.book_source import BOOK_FILE, default_data_dir, ensure_book, load_book
from gpt_lit.epoch_order import GlobalOrderSampler, TrainLoader, batch_settings, check_same_batches
from gpt_lit.errors import GptLitError, say
from gpt_lit.measure import unigram_entropy
from gpt_lit.prompts import Prompts, read_prompts
from gpt_lit.tokenizer import encode, get_tokenizer

__all__ = ["TimeMachineData"]


class TokenWindows(Dataset):
    """Windows of ``context_length`` tokens every ``stride`` tokens; the target is the input shifted by one."""

    def __init__(self, ids: torch.Tensor, context_length: int, stride: int):
        self.ids, self.context_length, self.stride = ids, context_length, stride
        self.starts = list(range(0, len(ids) - context_length, stride))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.starts[i]
        return self.ids[s : s + self.context_length], self.ids[s + 1 : s + self.context_length + 1]


def skipped_text(train: TokenWindows, val: TokenWindows) -> str:
    """One sentence: how much of the training and validation text no window's input holds (a stride > context)."""
    parts = []
    for name, windows in (("training", train), ("validation", val)):
        total = len(windows.ids)
        skipped = total - len(windows) * windows.context_length  # windows that do not overlap
        parts.append(f"{skipped:,} of the {total:,} {name} tokens ({skipped / total:.0%})")
    return (
        f"data.stride={train.stride} is longer than data.context_length={train.context_length}: the windows skip "
        f"{parts[0]} and {parts[1]}; leave data.stride unset (null) for windows that cover the text"
    )


class TimeMachineData(L.LightningDataModule):
    def __init__(
        self,
        data_dir: str | None = None,
        tokenizer: str = "gpt2",
        download: bool = True,
        context_length: int = 128,
        stride: int | None = None,
        train_fraction: float = 0.9,
        batch_size: int = 16,
        eval_batch_size: int = 64,
        eval_train: bool = True,
        seed: int = 123,
        num_workers: int = 0,
        multiprocessing_context: str | None = None,
        prompts: list[str] | None = None,
        prompts_file: str | None = None,
    ):
        """H. G. Wells' The Time Machine (Project Gutenberg eBook #35), tokenized with GPT-2's BPE.

        Args:
            data_dir: Folder holding another copy of pg35.txt as Gutenberg serves it (downloaded there if missing;
                another copy than the shipped one gets a warning). Default: $GPT_LIT_DATA_DIR, else the shipped book.
            tokenizer: The BPE tokenizer; only GPT-2's ("gpt2") ships (its vocabulary size: model.config.vocab_size).
            download: Download the book when it is not in data_dir (never needed for the shipped copy).
            context_length: Tokens per training window; also the model's context_length (linked).
            stride: Tokens between the starts of consecutive windows; None: context_length, the chapter's windows
                without overlap. Shorter makes windows overlap; longer leaves text out (said in one line).
            train_fraction: Fraction of the book's characters, from the start, for training; the rest validates.
            batch_size: Training windows per step, on each process (a run resumed mid-epoch keeps the checkpoint's
                until that epoch ends).
            eval_batch_size: Windows per batch when evaluating the whole training and validation sets.
            eval_train: Also evaluate the whole training set after every epoch, as the chapter's figure (loss/train).
            seed: Seed of the training shuffle; epoch e uses seed + e, so resumed runs see the same order.
            num_workers: DataLoader worker processes (0: load in the main process; the data is tiny).
            multiprocessing_context: How workers (num_workers > 0) start: "spawn", "fork", "forkserver"; None: the OS's.
            prompts: Texts for ``predict`` to continue.
            prompts_file: A text file of prompts for ``predict``, one per line (blank lines skipped).
        """
        super().__init__()
        stride = context_length if stride is None else stride
        if context_length <= 0 or stride <= 0 or batch_size <= 0 or eval_batch_size <= 0:
            raise GptLitError(
                "data.context_length, data.stride, data.batch_size and data.eval_batch_size must be positive"
            )
        if num_workers < 0:
            raise GptLitError(f"data.num_workers must be 0 (load in the main process) or more, got {num_workers}")
        if not 0.0 < train_fraction < 1.0:
            raise GptLitError(f"data.train_fraction must be between 0 and 1, got {train_fraction}")
        self.data_dir = data_dir or default_data_dir()
        self.download = download
        self.context_length, self.stride, self.train_fraction = context_length, stride, train_fraction
        self.batch_size, self.eval_batch_size, self.eval_train = batch_size, eval_batch_size, eval_train
        self.seed, self.num_workers = seed, num_workers
        methods = multiprocessing.get_all_start_methods()
        if multiprocessing_context is not None and multiprocessing_context not in methods:
            raise GptLitError(
                f"data.multiprocessing_context {multiprocessing_context!r} is not a start method here; "
                f"use one of {', '.join(methods)}, or leave it unset for the platform's default"
            )
        self.multiprocessing_context = multiprocessing_context
        self.prompts, self.prompts_file = list(prompts or []), prompts_file
        self.tokenizer = get_tokenizer(tokenizer)
        self.book_ids: torch.Tensor | None = None  # the whole story's tokens
        self.unigram_floor: float | None = None  # their unigram entropy, in nats: the loss of a model without context
        self.train_set: TokenWindows | None = None
        self.val_set: TokenWindows | None = None
        self.predict_set: Prompts | None = None

    def prepare_data(self) -> None:
        if self.trainer is None or self.trainer.state.fn != "predict":
            ensure_book(self.data_dir, self.download)  # downloads once, on one process; setup() reads it

    def check_inputs(self, stage: str | None, world: int | None = None) -> None:
        """Read and check what ``stage`` reads (the prompts, or the book's windows unless still to be downloaded), and
        with ``world`` processes that each gets a prompt or a full batch; a mistake is a GptLitError (for the CLI)."""
        if stage == "predict":
            prompts = self.prompt_set()
            if world is not None and len(prompts) < world:
                raise GptLitError(
                    f"{len(prompts)} prompt(s) for {world} processes: predict continues each prompt on one process, "
                    f"so give at least {world} prompts, or run predict on one process (--trainer.devices 1)"
                )
        elif stage in ("fit", "validate", "test"):
            if self.download and not (Path(self.data_dir) / BOOK_FILE).is_file():
                return  # prepare_data downloads it, on one process; setup reads it
            self.load_windows()
            if stage == "fit" and world is not None:
                self.check_full_batches(world)

    def setup(self, stage: str) -> None:
        if stage == "predict":
            return
        self.load_windows()
        if stage == "fit":
            self.check_full_batches()

    def load_windows(self) -> None:
        """The book's training and validation windows (read once); a GptLitError when there is not one of each."""
        if self.train_set is not None:
            return
        text = load_book(self.data_dir, self.download)
        split = int(self.train_fraction * len(text))
        ids = lambda s: torch.tensor(encode(s), dtype=torch.long)  # noqa: E731
        self.book_ids = ids(text)
        self.unigram_floor = unigram_entropy(self.book_ids)
        self.train_set = TokenWindows(ids(text[:split]), self.context_length, self.stride)
        self.val_set = TokenWindows(ids(text[split:]), self.context_length, self.stride)
        for name, ds in (("training", self.train_set), ("validation", self.val_set)):
            if len(ds) == 0:
                raise GptLitError(
                    f"{Path(self.data_dir) / BOOK_FILE}: its {name} part has {len(ds.ids)} tokens, too few for one "
                    f"window of context_length+1={self.context_length + 1}: use a smaller data.context_length or the "
                    f"full book"
                )
        if self.stride > self.context_length:
            say("note", skipped_text(self.train_set, self.val_set))

    def check_full_batches(self, world: int | None = None) -> None:
        """A GptLitError unless each of ``world`` processes (default: the Trainer's) gets a full training batch."""
        world = world or self._processes()[0]
        windows, each = len(self.train_set), len(self.train_set) // world
        if each >= self.batch_size:
            return
        if world == 1:
            raise GptLitError(
                f"{windows} training windows make no full batch of data.batch_size={self.batch_size}; use "
                f"data.batch_size {windows} or less"
            )
        fix = f"use data.batch_size {each} or less, or fewer processes" if each else "use fewer processes"
        raise GptLitError(
            f"{windows} training windows give each of the {world} processes {each}, no full batch of "
            f"data.batch_size={self.batch_size} (a batch size per process): {fix}"
        )

    def _loader(self, ds: Dataset, batch_size: int, kind: type[DataLoader] = DataLoader, **kw) -> DataLoader:
        # Its own generator, leaving dropout's global one alone: a run resumed at an epoch's end draws the same masks.
        generator = torch.Generator().manual_seed(self.seed)
        if self.num_workers > 0:  # DataLoader refuses a start method without workers
            kw["multiprocessing_context"] = self.multiprocessing_context
        return kind(ds, batch_size=batch_size, num_workers=self.num_workers, generator=generator, **kw)

    def check_resume(self, state: dict, source: str, world: int) -> None:
        """A GptLitError if a checkpoint's loader ``state`` is mid-epoch and the data on ``world`` processes differs."""
        self.check_inputs("fit")  # the windows, to compare them too
        check_same_batches(state, batch_settings(self, world), source)

    def _processes(self) -> tuple[int, int]:
        """(number of processes, this one's rank): (1, 0) outside a Trainer."""
        return (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)

    def train_dataloader(self) -> DataLoader:
        # Each epoch's global order is fixed by seed + epoch alone; the loader's state is where in its epoch it is.
        world, rank = self._processes()
        sampler = GlobalOrderSampler(self.train_set, world, rank, self.seed, self.batch_size)
        # The epoch Lightning sets at the epoch's start, set now: workers draw the indices when the iterator is made.
        fit_loop = self.trainer.fit_loop if self.trainer else None
        sampler.set_epoch(fit_loop.epoch_progress.current.processed if fit_loop else 0)
        progress = fit_loop.epoch_loop.batch_progress if fit_loop else None
        return self._loader(self.train_set, self.batch_size, TrainLoader, sampler=sampler, drop_last=True,
                            progress=progress, settings=batch_settings(self, world))  # fmt: skip

    def _eval_loader(self, ds: Dataset, batch_size: int) -> DataLoader:
        # Every window exactly once across processes, in order: process r of n takes windows r, r+n, r+2n, ...
        # (Lightning's default, a DistributedSampler, repeats windows to pad the shares, counting some twice).
        world, rank = self._processes()
        sampler = UnrepeatedDistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False) if world > 1 else None
        return self._loader(ds, batch_size, sampler=sampler)

    def val_dataloader(self) -> list[DataLoader]:
        loaders = [self._eval_loader(self.val_set, self.eval_batch_size)]
        if self.eval_train:
            loaders.append(self._eval_loader(self.train_set, self.eval_batch_size))
        return loaders

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set, self.eval_batch_size)

    def prompt_set(self) -> Prompts:
        """predict's prompts (``read_prompts``), read once."""
        if self.predict_set is None:
            self.predict_set = Prompts(read_prompts(self.prompts, self.prompts_file), self.context_length)
        return self.predict_set

    def predict_dataloader(self) -> DataLoader:
        self.check_inputs("predict", self._processes()[0])
        return self._eval_loader(self.prompt_set(), 1)
