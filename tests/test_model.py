"""The chapter's model, checked against the numbers printed in the chapter."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import untrained_gpt2

from gpt_lit.model import (
    GELU,
    GPT,
    Block,
    CausalSelfAttention,
    FeedForward,
    GPTConfig,
    LayerNorm,
    count_params,
    generate,
)
from gpt_lit.tokenizer import get_tokenizer


@pytest.fixture(scope="module")
def gpt2_seed123() -> GPT:
    return untrained_gpt2(seed=123)  # torch.manual_seed(123); GPT(GPTConfig()), made once per session


def test_layer_norm_on_four_numbers():
    x = torch.tensor([[2.0, 4.0, 6.0, 8.0], [1.0, 1.0, 1.0, 50.0]])
    out = LayerNorm(4)(x)
    book = torch.tensor([[-1.3416, -0.4472, 0.4472, 1.3416], [-0.5774, -0.5774, -0.5774, 1.7321]])
    assert torch.allclose(out, book, atol=5e-5)
    # The chapter's written-out formula, with the biased variance and eps = 1e-5.
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    assert torch.allclose(out, (x - mean) / torch.sqrt(var + 1e-5), atol=1e-6)
    assert torch.allclose(out.mean(-1), torch.zeros(2), atol=1e-6)


def test_layer_norm_eps_is_1e_5_where_it_matters():
    # Numbers 0.001 apart: variance 1.25e-6, below eps, so eps decides the output. By hand, the first value is
    # -0.0015 / sqrt(1.25e-6 + 1e-5) = -0.4472; with eps 1e-6 it would be -1.0000, with 1e-4 -0.1491.
    x = torch.tensor([[0.0, 0.001, 0.002, 0.003]], dtype=torch.float64)
    out = LayerNorm(4).double()(x)
    by_hand = [v / math.sqrt(1.25e-6 + 1e-5) for v in (-0.0015, -0.0005, 0.0005, 0.0015)]
    assert out[0].tolist() == pytest.approx(by_hand, abs=1e-9)
    assert round(out[0, 0].item(), 4) == -0.4472


def test_layer_norm_scale_and_shift():
    torch.manual_seed(0)
    norm = LayerNorm(16)
    with torch.no_grad():  # learned values, not the initial ones and zeros
        norm.weight.normal_()  # gamma
        norm.bias.normal_()  # beta
    x = torch.randn(3, 5, 16) * 4 + 2
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    assert torch.allclose(norm(x), norm.weight * (x - mean) / torch.sqrt(var + 1e-5) + norm.bias, atol=1e-5)


def test_gelu_table():
    x = torch.tensor([-3, -2, -1, -0.5, -0.1, 0, 0.5, 1, 2, 3])
    book_gelu = [-0.0036, -0.0454, -0.1588, -0.1543, -0.0460, 0, 0.3457, 0.8412, 1.9546, 2.9964]
    out = GELU()(x)
    assert torch.allclose(out, torch.tensor(book_gelu), atol=5e-5)
    c = (2.0 / torch.pi) ** 0.5  # the chapter's written-out tanh form
    assert torch.allclose(out, 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * x**3))), atol=1e-6)
    # "dipping to about -0.17 near x = -0.75"
    grid = torch.linspace(-3, 3, 601)
    y = GELU()(grid)
    assert round(y.min().item(), 2) == -0.17 and abs(grid[y.argmin()].item() + 0.75) < 0.02


def sizes(module: nn.Module) -> int:
    return count_params(module)


def test_parameter_table():
    cfg = GPTConfig()
    block = Block(cfg)
    assert sizes(FeedForward(cfg)) == 4_722_432
    assert sizes(CausalSelfAttention(768, 12, 1024, 0.1, True)) == 2_362_368
    assert sizes(block.norm1) + sizes(block.norm2) == 3_072
    assert sizes(block.attn.qkv) == 1_771_776 and sizes(block.attn.proj) == 590_592
    assert sizes(block.ffn.fc) == 2_362_368 and sizes(block.ffn.proj) == 2_360_064
    assert sizes(block) == 7_087_872
    with torch.device("meta"):  # the shapes alone: no memory, no seconds of initialising 163M and 124M weights
        model, tied = GPT(cfg), GPT(GPTConfig(tie_weights=True))
    assert sizes(model.tok_emb) == 38_597_376 and sizes(model.pos_emb) == 786_432
    assert sizes(model.blocks) == 85_054_464
    assert sizes(model.final_norm) == 1_536 and sizes(model.head) == 38_597_376
    assert count_params(model) == 163_037_184
    assert tied.head.weight is tied.tok_emb.weight
    assert count_params(tied) == 124_439_808
    # FeedForward is two-thirds of a block
    assert round(sizes(block.ffn) / sizes(block), 2) == 0.67


def test_init_is_gpt2_scale(gpt2_seed123):
    for m in gpt2_seed123.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            assert abs(m.weight.std().item() - 0.02) < 2e-3
        if isinstance(m, nn.Linear) and m.bias is not None:
            assert torch.count_nonzero(m.bias) == 0


def test_the_chapters_batch(gpt2_seed123):
    enc = get_tokenizer()
    batch = torch.tensor([enc.encode("The cat sat on"), enc.encode("A small model learns")])
    assert batch.tolist() == [[464, 3797, 3332, 319], [32, 1402, 2746, 22974]]
    gpt2_seed123.eval()
    with torch.no_grad():
        logits = gpt2_seed123(batch)
    assert logits.shape == torch.Size([2, 4, 50257])
    # "For 'The cat sat on', the most likely next token gets a probability of 0.000166 ...
    #  and the entropy of the whole distribution is 10.67 nats", against ln 50,257 = 10.82.
    p = logits[0, -1].softmax(-1)
    assert round(p.max().item(), 6) == 0.000166
    assert round(-(p * p.log()).sum().item(), 2) == 10.67


def test_causal_mask_later_tokens_never_change_earlier_logits():
    torch.manual_seed(0)
    model = GPT(GPTConfig(emb_dim=64, n_layers=2, n_heads=4, context_length=16)).eval()
    a = torch.randint(0, 50257, (1, 16))
    b = a.clone()
    b[0, 10:] = torch.randint(0, 50257, (6,))
    with torch.no_grad():
        la, lb = model(a), model(b)
    assert torch.equal(la[0, :10], lb[0, :10])
    assert not torch.allclose(la[0, 10:], lb[0, 10:])


def written_out_attention(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Chapter 3's attention step by step: scores, causal mask, softmax, weighted sum, projection."""
    B, T, C = x.shape
    q, k, v = attn.qkv(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, attn.n_heads, attn.head_dim).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)  # (B, n_heads, T, T)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return attn.proj((weights @ v).transpose(1, 2).reshape(B, T, C))


def test_sdpa_matches_written_out_attention():
    torch.manual_seed(1)
    attn = CausalSelfAttention(64, 4, 32, dropout=0.1, qkv_bias=True).eval()
    for p in attn.parameters():  # non-trivial biases too
        nn.init.normal_(p, std=0.2)
    x = torch.randn(3, 32, 64)
    with torch.no_grad():
        assert torch.allclose(attn(x), written_out_attention(attn, x), atol=1e-5)


def test_the_written_out_weights_are_those_the_forward_mixes_the_values_with():
    """``CausalSelfAttention.weights`` (what the diagnostics draw) against softmax(q k / sqrt(d)) by hand, and
    proj(weights @ v) against the model's own forward (scaled_dot_product_attention)."""
    torch.manual_seed(2)
    attn = CausalSelfAttention(16, 2, 8, dropout=0.1, qkv_bias=True).eval()
    for p in attn.parameters():
        nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 6, 16)
    w = attn.weights(x)  # (2, 2, 6, 6)
    q, k, v = (t.view(2, 6, 2, 8).transpose(1, 2) for t in (x @ attn.qkv.weight.T + attn.qkv.bias).split(16, -1))
    for t in range(6):  # row t: keys 0 .. t by hand, nothing after
        e = torch.exp((q[:, :, t : t + 1] * k[:, :, : t + 1]).sum(-1) / math.sqrt(8))  # (2, 2, t + 1)
        torch.testing.assert_close(w[:, :, t, : t + 1], e / e.sum(-1, keepdim=True), rtol=1e-5, atol=1e-6)
        assert (w[:, :, t, t + 1 :] == 0).all()
    with torch.no_grad():
        torch.testing.assert_close(attn.proj((w @ v).transpose(1, 2).reshape(2, 6, 16)), attn(x), rtol=1e-5, atol=1e-5)


def test_qkv_layout_is_gpt2s():
    """q, k, v are three consecutive emb_dim slices of the fused output; heads are consecutive head_dim slices."""
    attn = CausalSelfAttention(8, 2, 4, 0.0).eval()
    assert attn.qkv.weight.shape == (24, 8) and attn.qkv.bias is not None
    with torch.no_grad():
        attn.qkv.weight.zero_()
        attn.qkv.bias.zero_()
        attn.qkv.bias[16:24] = torch.arange(8.0)  # v = [0..7]: head 0 gets 0..3, head 1 gets 4..7
        attn.proj.weight.copy_(torch.eye(8))
        attn.proj.bias.zero_()
        y = attn(torch.randn(1, 3, 8))
    assert torch.allclose(y, torch.arange(8.0).expand(1, 3, 8))


def test_residual_switch():
    x = torch.randn(2, 8, 32)
    torch.manual_seed(0)
    with_res = Block(GPTConfig(emb_dim=32, n_heads=2, context_length=8, dropout=0.0)).eval()
    torch.manual_seed(0)
    without = Block(GPTConfig(emb_dim=32, n_heads=2, context_length=8, dropout=0.0, residual=False)).eval()
    with torch.no_grad():
        h = without.attn(without.norm1(x))
        assert torch.allclose(without(x), without.ffn(without.norm2(h)))
        h = x + with_res.attn(with_res.norm1(x))
        assert torch.allclose(with_res(x), h + with_res.ffn(with_res.norm2(h)))


def test_module_order_follows_the_chapter():
    names = [n for n, _ in GPT(GPTConfig(emb_dim=32, n_heads=2, n_layers=1, context_length=8)).named_modules()]
    expected = ["tok_emb", "pos_emb", "drop", "blocks", "blocks.0", "blocks.0.norm1", "blocks.0.attn",
                "blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.norm2", "blocks.0.ffn", "blocks.0.ffn.fc",
                "blocks.0.ffn.act", "blocks.0.ffn.proj", "blocks.0.drop", "final_norm", "head"]  # fmt: skip
    assert names[1:] == expected


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"emb_dim": 100, "n_heads": 12}, "n_heads"),
        ({"dropout": -0.1}, "dropout"),
        ({"dropout": 1.0}, "dropout"),
        ({"n_layers": 0}, "n_layers"),
        ({"context_length": -5}, "context_length"),
        ({"vocab_size": 0}, "vocab_size"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GPTConfig(**kwargs)


def test_too_long_sequence_is_a_clear_error():
    model = GPT(GPTConfig(emb_dim=32, n_heads=2, n_layers=1, context_length=8))
    with pytest.raises(ValueError, match="longer than context_length=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


class Recorder(torch.nn.Module):
    """A stand-in for the model that records each input it is given and always predicts (last token + 1): its
    stream is the logits already, and its final norm and head pass them on."""

    def __init__(self, context_length: int, vocab_size: int = 100):
        super().__init__()
        self.cfg, self.seen = GPTConfig(context_length=context_length, vocab_size=vocab_size), []
        self.final_norm, self.head = nn.Identity(), nn.Identity()

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        if idx.shape[1] > self.cfg.context_length:
            raise ValueError("longer than context_length")
        self.seen.append(idx.clone())
        return F.one_hot((idx + 1) % self.cfg.vocab_size, self.cfg.vocab_size).float()


def test_generate_feeds_the_last_context_length_tokens_of_a_long_prompt():
    # The chapter's generate: "idx_cond = idx[:, -context_size:]". Prompt 10..29 (20 tokens), context 8:
    # the first step sees 22..29, predicts 30; the next sees 23..30, predicts 31; then 24..31 -> 32.
    model = Recorder(context_length=8)
    prompt = torch.arange(10, 30).unsqueeze(0)
    out = generate(model, prompt, 3)
    assert out[0].tolist() == list(range(10, 33))
    assert [t[0].tolist() for t in model.seen] == [list(range(22, 30)), list(range(23, 31)), list(range(24, 32))]
    # a prompt shorter than the context is fed whole
    model = Recorder(context_length=8)
    generate(model, torch.tensor([[5, 6]]), 2)
    assert [t[0].tolist() for t in model.seen] == [[5, 6], [5, 6, 7]]


def test_generate_on_a_real_model_continues_from_the_last_context_length_tokens():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, emb_dim=32, n_heads=2, n_layers=1, context_length=8)).eval()
    prompt = torch.randint(0, 64, (2, 20))
    out = generate(model, prompt, 1)
    # the same last 8 tokens after a different start give the same next token
    other = torch.cat([torch.randint(0, 64, (2, 12)), prompt[:, -8:]], dim=1)
    assert torch.equal(generate(model, other, 1)[:, -1], out[:, -1])
    # and that token is the argmax of the model's last-position logits on those 8 tokens
    with torch.no_grad():
        assert torch.equal(out[:, -1], model(prompt[:, -8:])[:, -1].argmax(-1))


@torch.no_grad()
def chapters_generate(model, idx, max_new_tokens):
    """The chapter's ``generate``, as the book prints it."""
    model.eval()
    for _ in range(max_new_tokens):
        logits = model(idx[:, -model.cfg.context_length :])
        next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        idx = torch.cat([idx, next_id], dim=1)
    return idx


def test_greedy_generate_writes_what_the_chapters_loop_writes():
    """Two prompts of 3 tokens, 14 new tokens each: past the context of 8, where the window slides."""
    torch.manual_seed(5)
    model = GPT(GPTConfig(vocab_size=64, emb_dim=32, n_heads=2, n_layers=2, context_length=8))
    for p in model.parameters():  # logits far apart, so float rounding cannot change an argmax
        nn.init.normal_(p, std=0.5)
    prompt = torch.randint(0, 64, (2, 3))
    expected = chapters_generate(model, prompt, 14)
    assert all(len(set(row[3:].tolist())) > 2 for row in expected)  # not one token over and over
    assert torch.equal(generate(model, prompt, 14), expected)


class FixedLogits(torch.nn.Module):
    """A stand-in for the model whose next-token logits are always ``logits``, so sampling's law is known."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits, self.cfg = logits, GPTConfig(context_length=8)
        self.final_norm, self.head = nn.Identity(), nn.Identity()

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        return self.logits.expand(*idx.shape, -1)


def sampled_frequencies(logits: torch.Tensor, n: int, **kwargs) -> torch.Tensor:
    """How often each token comes first in ``n`` one-token generations."""
    out = generate(FixedLogits(logits), torch.zeros(n, 1, dtype=torch.long), 1, **kwargs)
    return torch.bincount(out[:, 1], minlength=len(logits)).double() / n


def softmax_by_hand(logits: list[float], temperature: float) -> list[float]:
    weights = [math.exp(v / temperature) for v in logits]
    return [w / sum(weights) for w in weights]


def test_sampling_follows_temperature_and_top_k():
    logits = torch.linspace(3.0, -3.0, 20)
    n, g = 20_000, torch.Generator().manual_seed(0)
    tolerance = 0.015  # > 4 standard deviations of a frequency over 20,000 draws
    for temperature in (0.5, 2.0):  # their top probabilities: 0.47 and 0.15
        expected = torch.tensor(softmax_by_hand(logits.tolist(), temperature), dtype=torch.double)
        freq = sampled_frequencies(logits, n, temperature=temperature, generator=g)
        assert (freq - expected).abs().max() < tolerance, temperature
    # top_k=5 keeps the five most likely tokens, renormalised; the whole vocabulary gives the others 21%
    expected = torch.tensor(softmax_by_hand(logits[:5].tolist(), 1.0) + [0.0] * 15, dtype=torch.double)
    freq = sampled_frequencies(logits, n, temperature=1.0, top_k=5, generator=g)
    assert freq[5:].sum() == 0 and (freq - expected).abs().max() < tolerance
    assert sampled_frequencies(logits, n, temperature=1.0, generator=g)[5:].sum() > 0.19
    # top_k=1 and temperature 0 both take the most likely token
    assert sampled_frequencies(logits, 10, temperature=1.0, top_k=1, generator=g)[0] == 1.0
    assert sampled_frequencies(logits, 10)[0] == 1.0
