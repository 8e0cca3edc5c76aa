"""The output head and the cross-entropy, each way written once: ``head_cross_entropy`` (training: fused, one
softmax gives the loss and its gradient), ``vocab_blocked_token_losses`` (evaluation: every token's loss from
tiles of logits that stay in the CPU's caches) and ``logits_losses`` (the plain path from whole logits, where the
other two do not apply: fp16, sharded parameters, ``torch.compile``).

The fused ways change no number beyond float rounding; ``GPTLightning`` switches them with ``fused_loss``, and
``tests/test_bench.py`` checks them against ``F.cross_entropy``. The logit lens reads its depths through the head
with ``vocab_blocked_token_losses`` too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Evaluation's tile of logits: ROWS tokens x BLOCK words, 8 MB in fp32, computed, reduced and dropped while in the
# CPU's last-level cache; the head's BLOCK rows (2 MB at emb_dim 256) are read once per ROWS tokens
# (docs/performance.md, "Where a run's time goes", has the measurement).
ROWS, BLOCK = 1024, 2048
# Training's logits get a multiple of PAD columns (``padded``): rows that start on whole cache lines.
PAD = 64


def token_losses(logits: torch.Tensor, probs: torch.Tensor, targets: torch.Tensor, host_check: bool) -> torch.Tensor:
    """-log softmax(logits)[t] per row, from the softmax already made: (N, V), (N, V), (N,) -> (N,).

    With ``host_check`` (on CPU, where it is free): -log p[t], exact to float rounding while p[t] is a normal
    float; a row whose target probability is below 1e-30 (a loss above 69 nats, which float32 cannot resolve
    from the softmax) gets its loss from logsumexp instead. Without (on a GPU, where that check would make
    the host wait for the device each step): the log-sum-exp from the row maxima, two more passes over the
    logits and no wait: log sum_j exp(x_j) = max_j x_j - log max_j p_j (the top probability never underflows).
    """
    t = targets[:, None]
    if not host_check:
        log_sum_exp = logits.amax(dim=-1) - probs.amax(dim=-1).log()
        return log_sum_exp - logits.gather(1, t).squeeze(1)
    losses = -probs.gather(1, t).squeeze(1).log()
    far = losses > 69.0  # p[t] < 1e-30
    if far.any():
        rows = far.nonzero().squeeze(1)
        far_logits = logits[rows]  # (n_far, V)
        losses[rows] = torch.logsumexp(far_logits, dim=-1) - far_logits.gather(1, t[rows]).squeeze(1)
    return losses


class _HeadCrossEntropy(torch.autograd.Function):
    """Output head and cross-entropy in one step, for training: mean_i -log softmax(h_i W^T)[t_i].

    The same numbers as ``F.cross_entropy(F.linear(h, W), t)``, with fewer passes over the (tokens x
    vocab_size) logits, the largest tensors of the step (411 MB at 16 x 128 tokens). One softmax gives both
    the loss, -log p_i[t_i], and its gradient, softmax - one_hot(t). Autograd instead runs log_softmax, then
    a zero-fill, a scatter and log_softmax's backward (two exps).
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype):
        h_c, w_c = h.to(dtype), padded(weight.to(dtype))  # the matmul's dtype: bf16 under bf16-mixed, as autocast does
        vocab_size = len(weight)
        logits = (h_c @ w_c.T).float()  # (N, V_padded); the softmax and the loss in fp32 always
        logits[:, vocab_size:] = -torch.inf  # the padding's words: probability 0, no gradient
        probs = torch.softmax(logits, dim=-1)  # (N, V_padded)
        losses = token_losses(logits, probs, targets, host_check=logits.device.type == "cpu")  # (N,)
        probs.scatter_add_(1, targets[:, None], probs.new_full((len(targets), 1), -1.0))  # d loss_i / d logits_i
        ctx.save_for_backward(h_c, w_c, probs.to(dtype))
        ctx.in_dtypes, ctx.vocab_size = (h.dtype, weight.dtype), vocab_size
        return losses.mean()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        h_c, w_c, grad_logits = ctx.saved_tensors  # the padding's rows of w_c and columns of grad_logits are 0
        scale = grad_loss / len(grad_logits)  # d(mean)/d(each term)
        grad_h = (grad_logits @ w_c).to(ctx.in_dtypes[0]) * scale  # (N, C)
        grad_w = grad_logits.T @ (h_c * scale.to(h_c.dtype))  # (V_padded, C); scaled the small side
        return grad_h, grad_w[: ctx.vocab_size].to(ctx.in_dtypes[1]), None, None


def padded(weight: torch.Tensor, multiple: int = PAD) -> torch.Tensor:
    """The head's (V, C) weight with zero rows added up to a multiple of ``multiple`` rows (GPT-2's 50,257 -> 50,304).

    With an odd number of columns, the (N x V) logits' rows start at addresses the matmul kernels cannot store to
    in whole vector registers, and the product runs slower than with 50,264 or 50,304 columns (docs/performance.md).
    The extra words get logits of -inf, so the softmax, the loss and both gradients have the same values, bit for
    bit in the runs measured. One copy of the weight a step (51 MB for GPT-2's vocabulary at C = 256)."""
    extra = -len(weight) % multiple
    return torch.cat([weight, weight.new_zeros(extra, weight.shape[1])]) if extra else weight


def head_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = ROWS) -> torch.Tensor:
    """``F.cross_entropy(F.linear(h, weight), targets)`` (mean over all N targets), computed faster.

    h: (N, C) final hidden states, weight: (V, C) output head, targets: (N,) token IDs, every one counted
    (there is no ignore_index). With gradients it uses ``_HeadCrossEntropy``; without (evaluation),
    the mean of ``vocab_blocked_token_losses``: tiles of ``chunk`` rows by 2048 words, so a batch of 64 x 128
    tokens never holds its 1.6 GB of logits at once (equal to float rounding, 1e-6 relative, not to the last bit;
    the same bits as the mean of evaluation's per-token losses). Under autocast
    the matmul runs in the autocast dtype (bf16-mixed: bf16) and the softmax in fp32, as ``F.linear``
    followed by ``.float()`` would.
    """
    dtype = autocast_dtype(h)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _HeadCrossEntropy.apply(h, weight, targets, dtype)
    return vocab_blocked_token_losses(h, weight, targets, rows=chunk).mean()


def autocast_dtype(h: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: the autocast dtype where autocast is on, else ``h``'s."""
    return torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype


@torch.no_grad()
def vocab_blocked_token_losses(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, block: int = BLOCK, rows: int = ROWS
) -> torch.Tensor:
    """Each row's cross-entropy ``-log softmax(h W^T)[t]``, (N,), from (N, C) rows, the (V, C) head and (N,) targets,
    for evaluation: ``rows`` rows at a time, and for each, the vocabulary ``block`` columns at a time.

    log sum_j exp(logit_j) is accumulated over the blocks (each block's own log-sum-exp, added with ``logaddexp``,
    as flash attention's softmax combines its blocks), and the target's logit is read from its block. One
    tile of logits (``rows`` x ``block``) stays in the CPU's caches, where a whole row of 50,257 logits, read
    and written several times by a log_softmax, goes to memory and back. Under autocast the matmul runs in the
    autocast dtype and the rest in fp32, as ``F.linear`` followed by ``.float()`` would. The same numbers as
    ``F.cross_entropy(..., reduction="none")`` up to float rounding (tests check).
    """
    dtype = autocast_dtype(h)
    h_c, w_c = h.to(dtype), weight.to(dtype)
    # Each block of words as (its first word, its number of words, its rows padded to a multiple of PAD: rows of
    # logits aligned, as in training); only the last block (1105 of GPT-2's words) is copied, once for all rows.
    starts = range(0, len(w_c), block)
    blocks = [(start, len(w_c[start : start + block]), padded(w_c[start : start + block])) for start in starts]
    losses = torch.empty(len(h), device=h.device)
    for i in range(0, len(h), rows):
        losses[i : i + rows] = row_losses(h_c[i : i + rows], blocks, targets[i : i + rows])
    return losses


def row_losses(h: torch.Tensor, blocks: list[tuple[int, int, torch.Tensor]], targets: torch.Tensor) -> torch.Tensor:
    """``vocab_blocked_token_losses`` of a few rows: (n, C) in the matmul's dtype, the head's blocks of words as
    ``vocab_blocked_token_losses`` makes them, (n,) targets -> (n,)."""
    n = len(h)
    log_sum_exp = torch.full((n,), -torch.inf, device=h.device)  # log sum_j exp(logit_j) over the blocks so far
    target_logits = torch.zeros(n, device=h.device)
    for start, n_words, words in blocks:
        logits = (h @ words.T).float()  # (n, a multiple of PAD columns)
        logits[:, n_words:] = -torch.inf  # the padding's columns count for nothing
        local = targets - start
        inside = (local >= 0) & (local < n_words)
        picked = logits.gather(1, local.clamp(0, n_words - 1)[:, None]).squeeze(1)
        target_logits = torch.where(inside, picked, target_logits)
        # The block's log sum exp, from one fused log_softmax: its largest entry is -log sum_j exp(logit_j - max).
        # (Faster than max, subtract, exp and sum one after another: docs/performance.md.)
        block_lse = logits.amax(dim=1) - torch.log_softmax(logits, dim=1).amax(dim=1)  # (n,)
        log_sum_exp = torch.logaddexp(log_sum_exp, block_lse)
    return log_sum_exp - target_logits


def logits_losses(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain cross-entropy from whole logits (N, V) and targets (N,): the mean, with gradients, and each token's
    loss, (), (N,). In fp32 whatever the logits' dtype (bf16 under bf16-mixed). The mean is
    ``F.cross_entropy(logits.float(), targets)`` to the last bit: that is ``nll_loss`` of ``log_softmax``."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    return F.nll_loss(logp, targets), -logp.gather(1, targets[:, None]).squeeze(1)
