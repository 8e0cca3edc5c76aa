"""The chapter's printed numbers, from the experiments scripts/reproduce_chapter.py prints."""

from __future__ import annotations

import math

import pytest
from conftest import chapter_continuation, load_script, untrained_gpt2
from conftest import chapter_experiment as experiment  # each experiment once per session

ex = load_script("reproduce_chapter")  # the experiments, beside the book's numbers


@pytest.fixture(scope="module")
def gpt2_untrained():
    return untrained_gpt2(seed=123)


def test_gradient_norms_with_residuals_are_the_chapters_row():
    ours = experiment(True, 12).grad_norms
    assert [f"{g:.2f}" for g in ours] == [f"{b:.2f}" for b in ex.BOOK_GRAD_NORMS[True]]


@pytest.mark.parametrize("n_layers, book", [(12, "0.563"), (48, "0.731")])
def test_similarity_with_residuals_is_the_chapters(n_layers, book):
    assert f"{experiment(True, n_layers).similarity:.3f}" == book


@pytest.mark.parametrize("n_layers", [12, 48])
def test_without_residuals_every_position_ends_as_the_same_vector(n_layers):
    assert f"{experiment(False, n_layers).similarity:.3f}" == "1.000"


def test_without_residuals_the_gradients_do_not_vanish():
    plain = experiment(False, 12).grad_norms  # ours: 1.52 1.52 1.30 ... 1.05 1.03 1.03; the book 1.22 ... 1.03
    residual = experiment(True, 12).grad_norms  # 0.91 ... 0.25
    assert len(plain) == 12
    assert all(0.8 <= g <= 1.7 for g in plain), plain
    # With residuals block 12 gets about a quarter of block 1's gradient; the plain stack keeps most of it
    # (ours 0.68, the book's 0.84): layer norm re-scales every block's input, so nothing decays away.
    assert residual[-1] < 0.3 * residual[0]
    assert plain[-1] > 0.6 * plain[0]


def test_untrained_model_is_barely_more_decided_than_a_uniform_guess(gpt2_untrained):
    nt = ex.next_token(gpt2_untrained, "The cat sat on")
    assert f"{nt.top_prob:.6f}" == "0.000166"
    assert f"{nt.uniform_prob:.7f}" == "0.0000199"
    assert f"{nt.entropy:.2f}" == "10.67"
    assert f"{nt.uniform_entropy:.2f}" == "10.82" and nt.uniform_entropy == pytest.approx(math.log(50257))


@pytest.mark.parametrize("prompt", list(ex.BOOK_CONTINUATIONS))
def test_untrained_model_writes_the_chapters_gibberish(gpt2_untrained, prompt):
    assert chapter_continuation(gpt2_untrained, prompt, 12) == ex.BOOK_CONTINUATIONS[prompt]


def test_parameter_table_rows_are_the_chapters(gpt2_untrained):
    for part, _, book, ours in ex.parameter_table(gpt2_untrained):
        assert ours == book, part


def test_layernorm_and_gelu_tables_are_the_chapters():
    assert [[f"{v:.4f}" for v in row] for row in ex.layernorm_example().tolist()] == [
        [f"{v:.4f}" for v in row] for row in ex.BOOK_LAYERNORM
    ]
    _, gelu, relu = ex.gelu_relu()
    assert [f"{v:.4f}" for v in gelu.tolist()] == [f"{v:.4f}" for v in ex.BOOK_GELU]
    assert relu.tolist() == ex.BOOK_RELU
