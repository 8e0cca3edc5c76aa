"""Wall time of a whole ``fit`` run, against the run's FLOP count divided by the measured matmul peak.

    python scripts/time_run.py configs/residual.yaml                           # fp32, 10 epochs (docs/performance.md)
    python scripts/time_run.py configs/residual.yaml --trainer.precision bf16-mixed
    python scripts/time_run.py configs/residual.yaml --trainer.max_epochs 1    # any other fit option

It runs ``python -m gpt_lit fit --config CONFIG [options]`` in this process (progress bar off; logs and
checkpoints in a temporary folder unless ``--keep``), with one more callback that counts the tokens the run
trained on and evaluated. It measures the fp32 matmul peak as ``scripts/bench.py`` does (2048 x 2048
``torch.mm``) before the run (the median of 10), before each evaluation (the median of 3; the epoch's checkpoint
writes, which a thread makes beside training, have ended by then) and after the run
(the median of 10), and divides by their mean: a shared machine's rate moves during a run (126 GFLOP/s before
and 186 after the same 10-epoch run was seen), and the run's matmuls ran at the rates in between. The time the
measurements take is not counted in ``wall_s`` (nor in a part below). The run's FLOPs are counted as in ``bench.py``:
6 N + 12 n_layers T emb_dim per training token, 2 N + 4 n_layers T emb_dim per evaluated token, with N
counted both ways (every parameter; matmul weights only). Not counted, so the ratio errs high: the
diagnostics' extra passes (a forward pass per epoch for the position similarity, gradient norms) and the
start (imports, tokenizing the book), which the wall time includes.

It prints one figure a line, ``name: value``: ``wall_s`` (from the script's start to the end of ``fit``),
``fit_s``, ``flops``, ``flops_over_peak_s`` and ``wall_vs_flops`` (``wall_s`` / ``flops_over_peak_s``),
each also ``_matmul_only``, and the final epoch losses.

Then where the wall time went, ``time/<part>_s`` (they add up to ``wall_s``), each with its ``share/<part>``:
  start             the script's start to the first training step: imports, tokenizing the book, building
                    the model, the trainer's setup
  train_matmul      the training steps' matrix products: their FLOPs (matmul weights only) over the peak
  train_rest        the rest of the training steps' time (softmax, dropout, norms, optimizer, autograd, loop)
  eval              the evaluation batches (the whole training and validation sets each epoch)
  checkpoints       time the training thread spent in ``trainer.save_checkpoint``
  diagnostics       everything else between the first step and the end of training: the epoch-end hooks of
                    the diagnostics (figures, samples, similarity, attention maps) and Lightning's loops
  end               the end of training to the end of ``fit``: waiting for the last checkpoint's write, teardown
"""

from __future__ import annotations

import time

START = time.perf_counter()  # the wall time counts the imports too: a user waits for them

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

from gpt_lit.flops import eval_flops_per_token, matmul_params, train_flops_per_token  # noqa: E402
from gpt_lit.flops import matmul_peak as peak_of  # noqa: E402
from gpt_lit.model import count_params  # noqa: E402
from gpt_lit.run.cli import main as gpt_lit_main  # noqa: E402


class TokenCount(Callback):
    """Tokens trained on and evaluated, and how long ``fit`` took."""

    def __init__(self):
        self.train_tokens = self.eval_tokens = 0
        self.seq_len = 0
        self.fit_s = 0.0

    def on_fit_start(self, trainer, pl_module) -> None:
        self._t0 = time.perf_counter()

    def on_fit_end(self, trainer, pl_module) -> None:
        self.fit_s = time.perf_counter() - self._t0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.train_tokens += batch[1].numel()
        self.seq_len = batch[1].shape[1]

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self.eval_tokens += batch[1].numel()


class Phases(Callback):
    """When training starts and ends, and the time spent in training batches, evaluation batches and saves."""

    def __init__(self):
        self.train_start = self.train_end = 0.0
        self.train_s = self.eval_s = self.save_s = self.saved_by_end = 0.0

    def on_fit_start(self, trainer, pl_module) -> None:
        save = trainer.save_checkpoint  # every save (LastCheckpoint's, ModelCheckpoint's) goes through it

        def timed_save(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return save(*args, **kwargs)
            finally:
                self.save_s += time.perf_counter() - t0

        trainer.save_checkpoint = timed_save

    def on_train_start(self, trainer, pl_module) -> None:
        self.train_start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self.train_end = time.perf_counter()
        self.saved_by_end = self.save_s  # a save after this (LastCheckpoint's at the end of fit) counts once

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.train_s += time.perf_counter() - self._t0

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._t0 = time.perf_counter()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.eval_s += time.perf_counter() - self._t0


class PeakDuringRun(Callback):
    """The fp32 matmul peak measured before each evaluation of fit, and the time the measurements took."""

    def __init__(self):
        self.peaks: list[float] = []
        self.spent = 0.0

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        t0 = time.perf_counter()
        self.peaks.append(matmul_peak(reps=3))
        self.spent += time.perf_counter() - t0


def matmul_peak(reps: int = 10) -> float:
    """FLOP/s of bench.py's 2048 x 2048 fp32 ``torch.mm`` on the CPU: the median of ``reps``, after one warm-up."""
    return peak_of("cpu", torch.float32, 2048, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Other options go to fit.")
    parser.add_argument("config", help="a gpt_lit config, e.g. configs/residual.yaml")
    parser.add_argument("--keep", action="store_true", help="log to the config's folder instead of a temporary one")
    args, fit_options = parser.parse_known_args()
    sys.argv = sys.argv[:1]  # the fit options go to the CLI as ``args``; LightningCLI warns if argv has them too
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

    t0 = time.perf_counter()
    peak_before = matmul_peak()
    measuring_before = time.perf_counter() - t0
    counter, phases, during = TokenCount(), Phases(), PeakDuringRun()
    with tempfile.TemporaryDirectory() as tmp:
        where = [] if args.keep else ["--trainer.logger.init_args.save_dir", tmp]
        cli = gpt_lit_main(
            ["fit", "--config", args.config, "--trainer.enable_progress_bar", "false", *where, *fit_options],
            extra_callbacks=[counter, phases, during],
        )
        end = time.perf_counter()
        wall = end - START - measuring_before - during.spent
    peak_after = matmul_peak()
    peaks = [peak_before, *during.peaks, peak_after]
    peak = sum(peaks) / len(peaks)

    model, T = cli.model.model, counter.seq_len
    cfg = model.cfg
    out: dict[str, float | str] = {
        "config": args.config,
        "precision": str(cli.trainer.precision),
        "epochs": cli.trainer.current_epoch,
        "train_tokens": counter.train_tokens,
        "eval_tokens": counter.eval_tokens,
        "wall_s": wall,
        "fit_s": counter.fit_s - during.spent,
        "peak_fp32_gflops_before": peak_before / 1e9,
        "peak_fp32_gflops_after": peak_after / 1e9,
        "peak_fp32_gflops_range": f"{min(peaks) / 1e9:.4g}-{max(peaks) / 1e9:.4g}",
        "peak_fp32_gflops_mean": peak / 1e9,
    }
    for suffix, n in (("", count_params(model)), ("_matmul_only", matmul_params(cfg))):
        flops = counter.train_tokens * train_flops_per_token(cfg, T, n) + counter.eval_tokens * eval_flops_per_token(
            cfg, T, n
        )
        out[f"flops{suffix}"] = float(flops)
        out[f"flops_over_peak_s{suffix}"] = flops / peak
        out[f"wall_vs_flops{suffix}"] = wall / (flops / peak)
    for name in ("loss/train", "loss/val"):
        if name in cli.trainer.callback_metrics:
            out[name] = cli.trainer.callback_metrics[name].item()
    train_matmul = counter.train_tokens * train_flops_per_token(cfg, T) / peak
    parts = {
        "start": phases.train_start - START - measuring_before,
        "train_matmul": train_matmul,
        "train_rest": phases.train_s - train_matmul,
        "eval": phases.eval_s,
        "checkpoints": phases.save_s,
        "diagnostics": (phases.train_end - phases.train_start)
        - phases.train_s
        - phases.eval_s
        - phases.save_s
        - during.spent,
        "end": end - phases.train_end - (phases.save_s - phases.saved_by_end),
    }
    for part, seconds in parts.items():
        out[f"time/{part}_s"] = seconds
    for part, seconds in parts.items():
        out[f"share/{part}"] = seconds / wall
    for k, v in out.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    main()
