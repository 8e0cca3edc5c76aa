"""gpt_lit.measure on a plain GPT, each function against the chapter's formula written out here: a tiny model whose
weights are scaled up, so the attention is far from uniform and the losses far from log(vocab_size)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from gpt_lit import measure
from gpt_lit.model import GPT, GPTConfig

T = 12


def tiny(residual: bool = True) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=97, context_length=16, emb_dim=24, n_layers=3, n_heads=3, dropout=0.1, residual=residual)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)  # weights 0.16 wide: sharp attention, confident logits
    return model.eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 97, (2, T), generator=g), torch.randint(0, 97, (2, T), generator=g)


def by_hand(model: GPT, idx: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Each block's stream in, attention input and output, feed-forward output and stream out, as the chapter's
    Block.forward writes them (eval mode: dropout is the identity)."""
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1]))
    out = []
    with torch.no_grad():
        for blk in model.blocks:
            a_x = blk.norm1(x)
            a = blk.attn(a_x)
            mid = x + a if blk.residual else a
            f = blk.ffn(blk.norm2(mid))
            new = mid + f if blk.residual else f
            out.append({"in": x, "attn_x": a_x, "attn": a, "mid": mid, "ffn": f, "out": new})
            x = new
    return out


def written_out_weights(blk, x: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) from the qkv weights, head by head, with explicit loops over positions."""
    B, T_, C = x.shape
    H = blk.attn.n_heads
    d = C // H
    q, k, _ = F.linear(x, blk.attn.qkv.weight, blk.attn.qkv.bias).split(C, dim=-1)
    w = torch.zeros(B, H, T_, T_)
    for h in range(H):
        qh, kh = q[..., h * d : (h + 1) * d], k[..., h * d : (h + 1) * d]
        for t in range(T_):
            scores = (qh[:, t : t + 1] * kh[:, : t + 1]).sum(-1) / math.sqrt(d)  # (B, t + 1): keys 0 .. t
            w[:, h, t, : t + 1] = scores.softmax(-1)
    return w


@pytest.mark.parametrize("residual", [True, False])
def test_the_record_is_what_each_block_read_and_wrote(residual):
    model, (x, _) = tiny(residual), batch()
    record, hand = measure.record_blocks(model, x), by_hand(model, x)
    assert torch.equal(record.tokens, x)
    for i, h in enumerate(hand):
        for name, key in (("attn_in", "in"), ("attn_x", "attn_x"), ("attn_out", "attn"), ("ffn_in", "mid"),
                          ("ffn_out", "ffn"), ("block_out", "out")):  # fmt: skip
            torch.testing.assert_close(getattr(record, name)[i], h[key], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("residual", [True, False])
def test_each_attention_row_sums_to_one_and_is_the_written_out_softmax(residual):
    model, (x, _) = tiny(residual), batch()
    record = measure.record_blocks(model, x)
    weights = measure.attention_weights(model, record)
    assert len(weights) == 3
    for blk, w, h in zip(model.blocks, weights, by_hand(model, x), strict=True):
        assert w.shape == (2, 3, T, T) and w.dtype == torch.float32
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, T))
        torch.testing.assert_close(w, written_out_weights(blk, h["attn_x"]), atol=1e-5, rtol=1e-4)
    assert max(w.max().item() for w in weights) > 0.9  # sharp: the scaled-up weights make a difference


def test_attention_entropy_is_minus_sum_p_log_p_of_each_row():
    w = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    expected = [0.0, math.log(2), -sum(p * math.log(p) for p in (0.2, 0.3, 0.5))]
    torch.testing.assert_close(measure.attention_entropy(w), torch.tensor(expected))
    model, (x, _) = tiny(), batch()
    weights = measure.attention_weights(model, measure.record_blocks(model, x))[0]
    entropy = measure.attention_entropy(weights)
    assert entropy.shape == (2, 3, T)
    row = weights[1, 2, 7, :8].tolist()
    assert entropy[1, 2, 7].item() == pytest.approx(-sum(p * math.log(p) for p in row if p > 0), abs=1e-5)
    assert (entropy[..., 0] == 0).all()  # the first position sees one token


@pytest.mark.parametrize("residual", [True, False])
def test_stream_and_write_sizes_are_rms_norms_of_the_blocks_outputs(residual):
    model, (x, _) = tiny(residual), batch()
    record, hand = measure.record_blocks(model, x), by_hand(model, x)

    def rms(t):  # sqrt(mean of squares) of each token's emb_dim numbers
        return (t**2).sum(-1).div(t.shape[-1]).sqrt()

    stream, (attn, ffn) = measure.stream_sizes(record), measure.write_sizes(record)
    assert stream.shape == attn.shape == ffn.shape == (3, 2, T)
    for i, h in enumerate(hand):
        torch.testing.assert_close(stream[i], rms(h["out"]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(attn[i], rms(h["attn"]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ffn[i], rms(h["ffn"]), atol=1e-5, rtol=1e-5)
    attn_ratio, ffn_ratio = measure.update_ratios(record)
    for i, h in enumerate(hand):
        assert attn_ratio[i].item() == pytest.approx((h["attn"].pow(2).mean() / h["in"].pow(2).mean()).sqrt().item(),
                                                     rel=1e-5)  # fmt: skip
        assert ffn_ratio[i].item() == pytest.approx((h["ffn"].pow(2).mean() / h["mid"].pow(2).mean()).sqrt().item(),
                                                    rel=1e-5)  # fmt: skip
    assert measure.batch_rms(stream)[-1].item() == pytest.approx(hand[-1]["out"].pow(2).mean().sqrt().item(), rel=1e-5)


def test_the_lens_after_the_last_block_is_the_model():
    model, (x, _) = tiny(), batch()
    record = measure.record_blocks(model, x)
    logits = model(x)
    last = measure.lens_logits(model, record, 2)
    torch.testing.assert_close(last, logits, atol=1e-4, rtol=1e-5)
    assert torch.equal(last.argmax(-1), logits.argmax(-1))
    first = measure.lens_logits(model, record, 0)  # head(final_norm(block 1's output)), written out
    h = by_hand(model, x)[0]["out"]
    normed = (h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    normed = normed * model.final_norm.weight + model.final_norm.bias
    torch.testing.assert_close(first, normed @ model.head.weight.T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("residual", [True, False])
def test_lens_losses_are_each_depths_cross_entropy(residual):
    model, (x, y) = tiny(residual), batch()
    record = measure.record_blocks(model, x)
    losses = measure.lens_losses(model, record, y)
    assert losses.shape == (3, 2, T)
    for i, h in enumerate(by_hand(model, x)):
        logits = model.head(model.final_norm(h["out"]))  # (B, T, V)
        expected = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(2, T)
        torch.testing.assert_close(losses[i], expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(losses[-1], measure.token_losses(model, x, y), atol=1e-5, rtol=1e-5)


def test_token_losses_are_cross_entropy_per_position():
    model, (x, y) = tiny(), batch()
    losses = measure.token_losses(model, x, y)
    logp = model(x).log_softmax(-1)
    expected = torch.stack([torch.stack([-logp[b, t, y[b, t]] for t in range(T)]) for b in range(2)])
    torch.testing.assert_close(losses, expected, atol=1e-4, rtol=1e-5)
    assert losses.mean().item() > math.log(97) + 0.2  # confident and wrong: the scaled-up head is far from uniform


def test_position_similarity_is_the_mean_cosine_over_pairs_of_positions():
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 5, 4, generator=g)
    expected = []
    for b in range(2):
        pairs = [F.cosine_similarity(hidden[b, i], hidden[b, j], dim=0).item()
                 for i in range(5) for j in range(5) if i != j]  # fmt: skip
        expected.append(sum(pairs) / len(pairs))
    torch.testing.assert_close(measure.position_similarity(hidden), torch.tensor(expected))
    same = torch.ones(1, 6, 4) * torch.tensor([1.0, -2.0, 3.0, 0.5])
    assert measure.position_similarity(same).item() == pytest.approx(1.0)


def test_loss_by_position_and_by_octave():
    losses = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]])
    assert measure.position_means(losses).tolist() == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    centres, means = measure.octave_means([2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    assert means == [2.0, 3.5, 7.0]  # positions 1; 2-3; 4-8 (the last octave runs to the end)
    assert centres == pytest.approx([1.0, math.sqrt(6), math.sqrt(32)])


def test_unigram_entropy_is_the_entropy_of_token_frequencies():
    ids = torch.tensor([5, 5, 5, 7, 7, 100])
    counts = Counter(ids.tolist())
    expected = -sum(c / 6 * math.log(c / 6) for c in counts.values())
    assert measure.unigram_entropy(ids) == pytest.approx(expected, rel=1e-12)
    assert measure.unigram_entropy(torch.tensor([3, 3, 3])) == 0.0
