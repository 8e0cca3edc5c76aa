"""The output head's cross-entropy, -log softmax(h W^T)[t] for each token: ``token_losses``, the one function of the
training loss, the whole-set evaluation and the logit lens. Under autocast the head's matmul runs in the autocast
dtype and the softmax in fp32, as ``F.linear`` then ``.float()``.
"""

import torch
import torch.nn.functional as F

# Evaluation's tile of logits, TILE_TOKENS tokens x TILE_WORDS words (8 MB in fp32): reduced while in the CPU's cache.
TILE_TOKENS, TILE_WORDS = 1024, 2048
# The logits get a multiple of COLUMN_MULTIPLE columns (``_padded``): rows that start on whole cache lines.
COLUMN_MULTIPLE = 64


def token_losses(h: torch.Tensor, weight: torch.Tensor | None, targets: torch.Tensor) -> torch.Tensor:
    """Each token's -log softmax(h W^T)[t]: (N, C) normed hidden states, the (V, C) head's weight, (N,) targets -> (N,);
    fused with gradients, in tiles without. ``weight=None``: ``h`` is the (N, V) logits, and it is ``F.cross_entropy``.
    """
    if weight is None:
        return F.cross_entropy(h.float(), targets, reduction="none")
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _HeadCrossEntropy.apply(h, weight, targets, _matmul_dtype(h))
    return vocab_blocked_token_losses(h, weight, targets)


class _HeadCrossEntropy(torch.autograd.Function):
    """Output head and cross-entropy in one step, for training: -log softmax(h_i W^T)[t_i] for each row i, as
    ``F.cross_entropy(F.linear(h, W), t, reduction="none")`` with fewer passes over the logits: one softmax gives both
    the loss, -log p_i[t_i], and its gradient, softmax - one_hot(t)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype):
        h_c, w_c = h.to(dtype), _padded(weight.to(dtype))  # the matmul's dtype: bf16 under bf16-mixed
        vocab_size = len(weight)
        logits = (h_c @ w_c.T).float()  # (N, V_padded); the softmax and the loss in fp32 always
        logits[:, vocab_size:] = -torch.inf  # the padding's words: probability 0, no gradient
        probs = torch.softmax(logits, dim=-1)  # (N, V_padded)
        losses = _losses_from_softmax(logits, probs, targets, host_check=logits.device.type == "cpu")  # (N,)
        probs.scatter_add_(1, targets[:, None], probs.new_full((len(targets), 1), -1.0))  # d loss_i / d logits_i
        ctx.save_for_backward(h_c, w_c, probs.to(dtype))
        ctx.in_dtypes, ctx.vocab_size = (h.dtype, weight.dtype), vocab_size
        return losses

    @staticmethod
    def backward(ctx, grad_losses: torch.Tensor):
        h_c, w_c, grad_logits = ctx.saved_tensors  # the padding's rows of w_c and columns of grad_logits are 0
        scale = grad_losses[:, None]  # (N, 1): each row's d(result)/d(loss_i), applied to the small side
        grad_h = (grad_logits @ w_c).to(ctx.in_dtypes[0]) * scale  # (N, C)
        grad_w = grad_logits.T @ (h_c * scale.to(h_c.dtype))  # (V_padded, C)
        return grad_h, grad_w[: ctx.vocab_size].to(ctx.in_dtypes[1]), None, None


def _losses_from_softmax(logits: torch.Tensor, probs: torch.Tensor, targets: torch.Tensor, host_check: bool):
    """-log softmax(logits)[t] per row from the softmax made: with ``host_check`` (CPU) -log p[t], or logsumexp where
    p[t] < 1e-30; without (GPU: no wait for the host), log sum_j exp(x_j) = max_j x_j - log max_j p_j."""
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


@torch.no_grad()
def vocab_blocked_token_losses(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, tokens: int = TILE_TOKENS, words: int = TILE_WORDS
) -> torch.Tensor:
    """``token_losses`` without gradients, in tiles of ``tokens`` rows x ``words`` words that stay in the CPU's caches,
    each block's log-sum-exp added with ``logaddexp`` (as flash attention combines its blocks)."""
    dtype = _matmul_dtype(h)
    h_c, w_c = h.to(dtype), weight.to(dtype)
    # Each block of words as (its first word, its number of words, its rows padded); only the last is copied, once.
    starts = range(0, len(w_c), words)
    blocks = [(start, len(w_c[start : start + words]), _padded(w_c[start : start + words])) for start in starts]
    losses = torch.empty(len(h), device=h.device)
    for i in range(0, len(h), tokens):
        rows, t = h_c[i : i + tokens], targets[i : i + tokens]  # (n, C), (n,)
        log_sum_exp = torch.full((len(t),), -torch.inf, device=h.device)  # over the blocks so far
        target_logits = torch.zeros(len(t), device=h.device)
        for start, n_words, block in blocks:
            logits = (rows @ block.T).float()  # (n, a multiple of COLUMN_MULTIPLE columns)
            logits[:, n_words:] = -torch.inf  # the padding's columns count for nothing
            local = t - start
            inside = (local >= 0) & (local < n_words)
            picked = logits.gather(1, local.clamp(0, n_words - 1)[:, None]).squeeze(1)
            target_logits = torch.where(inside, picked, target_logits)
            # The block's log sum exp from one fused log_softmax, whose largest entry is -log sum_j exp(logit_j - max).
            block_lse = logits.amax(dim=1) - torch.log_softmax(logits, dim=1).amax(dim=1)  # (n,)
            log_sum_exp = torch.logaddexp(log_sum_exp, block_lse)
        losses[i : i + tokens] = log_sum_exp - target_logits
    return losses


def _padded(weight: torch.Tensor) -> torch.Tensor:
    """The head's (V, C) weight with zero rows up to a multiple of COLUMN_MULTIPLE rows (50,257 -> 50,304): logits'
    rows that start on whole cache lines make the matmul faster (docs/performance.md); their -inf logits change
    nothing."""
    extra = -len(weight) % COLUMN_MULTIPLE
    return torch.cat([weight, weight.new_zeros(extra, weight.shape[1])]) if extra else weight


def _matmul_dtype(h: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: the autocast dtype where autocast is on, else ``h``'s."""
    return torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
