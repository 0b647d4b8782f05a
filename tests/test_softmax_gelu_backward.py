"""softmax, log_softmax and gelu with their own backward steps, softmax's exp with vanishing lanes, vector equality,
a condition shared by a vector's lanes and position ramps: values and gradients against torch (masked rows, -inf,
NaN, T=1024 attention, an embedding at nanoGPT's size) and the kernels a step takes."""

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import assert_close, pair, random_array

SPECIAL = [float("-inf"), -1e30, -200.0, -105.5, -105.0, -104.0, -100.0, -88.0, -87.0, -1.0, -0.0, 0.0, 1e-30, 1.0,
           10.0, 40.0, 88.0, 88.8, 89.0, 105.0, 106.0, float("inf"), float("nan")]


def count_kernels(function: object) -> int:
    with em.profile() as record:
        function()  # type: ignore[operator]
    return len(record.kernels)


def test_exp_at_special_values_matches_torch(device: str) -> None:
    values = np.array(SPECIAL, dtype=np.float32)
    x, tx = pair(values, device, requires_grad=True)
    result, expected = x.exp(), tx.exp()
    assert_close(result, expected, rtol=2e-6, atol=0)
    result.backward(em.ones_like(result))
    expected.backward(torch.ones_like(expected))
    assert_close(x.grad, tx.grad, rtol=2e-6, atol=0)


def test_exp_of_mostly_vanishing_values_matches_torch(device: str) -> None:
    """A vector of lanes below the limit next to ordinary ones (the lanes a masked softmax exponentiates)."""
    values = random_array((3, 1001), low=-3, high=3)
    values[:, ::2] = -np.inf
    values[1, ::3] = -150.0
    values[2, 1::4] = -103.5  # denormal results
    x, tx = pair(values, device)
    assert_close(x.exp(), tx.exp(), rtol=2e-6, atol=0)


@pytest.mark.parametrize("function", ["softmax", "log_softmax"])
def test_softmax_of_far_below_the_maximum_matches_torch(device: str, function: str) -> None:
    """Shifted values at and past exp's limit (denormal results, exact zeros) and a NaN row."""
    row = np.array([0.0, -1e30, -200.0, -105.5, -105.0, -104.0, -103.5, -100.0, -88.0, -87.0, -1.0, float("-inf")],
                   dtype=np.float32)
    values = np.stack([row, row + 3.0, np.roll(row, 5), np.full_like(row, np.nan)])
    x, tx = pair(values, device, requires_grad=True)
    result, expected = getattr(x, function)(-1), getattr(tx, function)(-1)
    assert_close(result, expected, rtol=2e-6, atol=0)
    weights = random_array(values.shape, seed=5)
    (result.where(result > -1e30, 0.0) * em.tensor(weights, device=device)).sum().backward()
    (expected.where(expected > -1e30, 0.0) * torch.tensor(weights)).sum().backward()
    assert_close(x.grad, tx.grad, atol=1e-6)


@pytest.mark.parametrize("dim", [-1, 1])
def test_masked_softmax_backward_matches_torch(device: str, dim: int) -> None:
    values = random_array((2, 3, 33, 45), low=-4, high=4)
    mask = np.tril(np.ones((33, 45), dtype=bool))
    mask[5, :] = False  # a fully masked row: NaN everywhere, as in torch
    values[1, 2, 7, 3] = np.nan
    x, tx = pair(values, device, requires_grad=True)
    keep, tkeep = pair(mask, device)
    grad, tgrad = pair(random_array((2, 3, 33, 45), seed=3), device)
    result = x.masked_fill(~keep, float("-inf")).softmax(dim)
    expected = tx.masked_fill(~tkeep, float("-inf")).softmax(dim)
    assert_close(result, expected, atol=1e-6)
    result.backward(grad)
    expected.backward(tgrad)
    assert_close(x.grad, tx.grad, atol=1e-5)


@pytest.mark.parametrize("shape, dim", [((7, 19), -1), ((7, 19), 0), ((3, 5, 4), 1), ((), 0)])
def test_log_softmax_backward_matches_torch(device: str, shape: tuple[int, ...], dim: int) -> None:
    values = random_array(shape, low=-5, high=5)
    x, tx = pair(values, device, requires_grad=True)
    result, expected = x.log_softmax(dim), tx.log_softmax(dim)
    assert_close(result, expected, atol=1e-6)
    (result * result).sum().backward()
    (expected * expected).sum().backward()
    assert_close(x.grad, tx.grad, atol=1e-5)


def test_softmax_second_derivative_matches_torch(device: str) -> None:
    x, tx = pair(random_array((4, 9)), device, requires_grad=True)
    weights, tweights = pair(random_array((4, 9), seed=2), device)
    (gradient,) = em.autograd.grad((x.softmax(-1) * weights).sum(), x, create_graph=True)
    (tgradient,) = torch.autograd.grad((tx.softmax(-1) * tweights).sum(), tx, create_graph=True)
    (gradient * gradient).sum().backward()
    (tgradient * tgradient).sum().backward()
    assert_close(x.grad, tx.grad, atol=1e-5)


def test_gelu_backward_matches_torch_at_special_values(device: str) -> None:
    values = np.concatenate([np.array(SPECIAL, dtype=np.float32), random_array((1000,), low=-8, high=8)])
    x, tx = pair(values, device, requires_grad=True)
    result = em.nn.functional.gelu(x)
    expected = torch.nn.functional.gelu(tx)
    finite = ~np.isposinf(values)  # gelu(inf): ember's inf where torch's formula gives inf - inf * 0 = NaN
    assert_close(result.numpy()[finite], expected.detach().numpy()[finite], atol=1e-6)
    result.backward(em.ones_like(result))
    expected.backward(torch.ones_like(expected))
    assert_close(x.grad, tx.grad, atol=2e-6)


def test_attention_with_a_thousand_positions_matches_torch(device: str) -> None:
    """nanoGPT's hand-written causal attention at T=1024: scores, masked softmax, weights @ v, and its gradients."""
    length, heads, width = 1024, 2, 16
    q, tq = pair(random_array((1, heads, length, width), seed=1), device, requires_grad=True)
    k, tk = pair(random_array((1, heads, length, width), seed=2), device, requires_grad=True)
    v, tv = pair(random_array((1, heads, length, width), seed=3), device, requires_grad=True)
    mask, tmask = pair(np.tril(np.ones((length, length), dtype=np.float32)), device)

    def attention(library: object, q: object, k: object, v: object, mask: object) -> object:
        scores = (q @ k.transpose(-2, -1)) * (1.0 / width**0.5)  # type: ignore[attr-defined]
        weights = scores.masked_fill(mask == 0, float("-inf")).softmax(-1)
        return weights @ v

    result, expected = attention(em, q, k, v, mask), attention(torch, tq, tk, tv, tmask)
    assert_close(result, expected, atol=2e-5)
    (result * result).sum().backward()  # type: ignore[operator]
    (expected * expected).sum().backward()  # type: ignore[operator]
    for ours, theirs in ((q, tq), (k, tk), (v, tv)):
        assert_close(ours.grad, theirs.grad, atol=2e-4, rtol=1e-3)


def test_vector_equality_selects_like_torch(device: str) -> None:
    """x == value packed into vectors (and NaN, which equals nothing) over sizes that are not multiples of lanes."""
    values = np.round(random_array((37, 203), low=-3, high=3))
    values[::5, ::7] = np.nan
    x, tx = pair(values, device)
    assert_close(em.where(x == 0, x + 7, x * 2), torch.where(tx == 0, tx + 7, tx * 2))
    assert_close(em.where(x == x, x, -1.0), torch.where(tx == tx, tx, -1.0))


def test_mlp_step_with_gelu_is_fourteen_kernels(device: str) -> None:
    """Linear, GELU, Linear forward and backward: gelu's gradient is one step (20 kernels with the chain rule
    through erfc's polynomial and branches)."""
    em.manual_seed(0)
    x = em.tensor(random_array((64, 32)), device=device)
    mlp = em.nn.Sequential(em.nn.Linear(32, 128), em.nn.GELU(), em.nn.Linear(128, 32)).to(device)

    def step() -> None:
        mlp.zero_grad()
        mlp(x).square().sum().backward()
        em.realize(*[parameter.grad for parameter in mlp.parameters()])

    step()
    assert count_kernels(step) <= 14


def test_masked_attention_step_is_eleven_kernels(device: str) -> None:
    """Scores, masked softmax, weights @ k and the gradients of q and k: softmax's backward is one step (13
    kernels through exp(x - max) / sum, with the max's gradient)."""
    q = em.tensor(random_array((2, 2, 16, 8), seed=1), device=device, requires_grad=True)
    k = em.tensor(random_array((2, 2, 16, 8), seed=2), device=device, requires_grad=True)
    mask = em.tensor(np.tril(np.ones((16, 16), dtype=np.float32)), device=device)

    def step() -> None:
        q.grad = k.grad = None
        weights = (q @ k.transpose(-2, -1)).masked_fill(mask == 0, float("-inf")).softmax(-1)
        (weights @ k).square().sum().backward()
        em.realize(q.grad, k.grad)

    step()
    assert count_kernels(step) <= 11


def test_embedding_gradient_at_nanogpt_size_matches_torch(device: str) -> None:
    """A one-hot select whose condition every lane of a row shares (vectorize.SCALAR_CONDITION on c): the
    embedding's rows and their gradient summed over 4096 tokens, with a repeated token and an infinite gradient."""
    indices = np.random.default_rng(0).integers(0, 87, (64, 64))
    indices[0, :8] = 5
    weight, tweight = pair(random_array((87, 67)), device, requires_grad=True)
    index, tindex = pair(indices, device)
    gradient_values = random_array((64, 64, 67), seed=4)
    gradient_values[3, 3, 2] = np.inf  # only its own row becomes infinite (a product with 0 would spread NaN)
    gradient, tgradient = pair(gradient_values, device)
    result = em.nn.functional.embedding(index, weight)
    expected = torch.nn.functional.embedding(tindex, tweight)
    assert_close(result, expected, atol=0, rtol=0)
    result.backward(gradient)
    expected.backward(tgradient)
    assert_close(weight.grad, tweight.grad, atol=2e-5)


def test_a_condition_shared_by_the_lanes_keeps_the_kernel_vectorized() -> None:
    """The embedding's backward on c: its one-hot condition is scalar, its values vectors (it was scalar: 30x slower)."""
    from ember.ir.vectorize import vector_width
    from ember.scheduler.compile_cache import COMPILED

    before = set(COMPILED)
    weight = em.tensor(random_array((87, 64)), device="c", requires_grad=True)
    index = em.tensor(np.random.default_rng(1).integers(0, 87, (32, 16)), device="c")
    em.nn.functional.embedding(index, weight).backward(em.ones(32, 16, 64, device="c"))
    em.realize(weight.grad)
    widths = [vector_width(compiled.ir) for key, compiled in COMPILED.items() if key not in before and key[0] == "c:0"]
    assert widths and min(widths) > 1, widths


def test_causal_sdpa_with_a_thousand_positions_matches_torch(device: str) -> None:
    """scaled_dot_product_attention(is_causal=True) at T=1024 (its softmax one step for autograd, its mask made of
    positions packed into vectors on c), values and the gradients of q, k and v."""
    length, heads, width = 1024, 2, 16
    q, tq = pair(random_array((1, heads, length, width), seed=1), device, requires_grad=True)
    k, tk = pair(random_array((1, heads, length, width), seed=2), device, requires_grad=True)
    v, tv = pair(random_array((1, heads, length, width), seed=3), device, requires_grad=True)
    result = em.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    assert_close(result, expected, atol=2e-5)
    (result * result).sum().backward()
    (expected * expected).sum().backward()
    for ours, theirs in ((q, tq), (k, tk), (v, tv)):
        assert_close(ours.grad, theirs.grad, atol=2e-4, rtol=1e-3)


def test_causal_sdpa_with_a_fully_masked_row_matches_torch(device: str) -> None:
    """A boolean mask with a row of no keys: zero weights and zero gradients there, as torch's math attention."""
    mask_values = np.tril(np.ones((9, 13), dtype=bool))
    mask_values[4] = False
    q, tq = pair(random_array((2, 3, 9, 5), seed=1), device, requires_grad=True)
    k, tk = pair(random_array((2, 3, 13, 5), seed=2), device, requires_grad=True)
    v, tv = pair(random_array((2, 3, 13, 4), seed=3), device, requires_grad=True)
    mask, tmask = pair(mask_values, device)
    result = em.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask)
    expected = torch.nan_to_num(expected)  # torch's math kernel gives NaN rows where its fused kernels give zeros
    assert_close(result, expected, atol=1e-5)
    (result * result).sum().backward()
    (expected * expected).sum().backward()
    for ours, theirs in ((q, tq), (k, tk), (v, tv)):
        assert_close(ours.grad, torch.nan_to_num(theirs.grad), atol=1e-4)


def test_causal_sdpa_kernels_are_vectorized_on_c() -> None:
    """The causal mask compares float positions: lanes of consecutive positions are one vector (a ramp), so the
    softmax and weights @ v kernels pack into vectors (they were scalar: 15x slower)."""
    from ember.ir.vectorize import vector_width
    from ember.scheduler.compile_cache import COMPILED

    before = set(COMPILED)
    q = em.tensor(random_array((2, 3, 40, 16), seed=1), device="c", requires_grad=True)
    result = em.nn.functional.scaled_dot_product_attention(q, q * 0.5, q * 2.0, is_causal=True)
    result.sum().backward()
    em.realize(q.grad)
    widths = [vector_width(compiled.ir) for key, compiled in COMPILED.items() if key not in before and key[0] == "c:0"]
    assert widths and sum(width > 1 for width in widths) >= len(widths) - 1, widths


def test_softmax_and_log_softmax_at_ten_million_elements_match_torch(device: str) -> None:
    """150 rows of 70,001 (10.5M elements; past 65,535 both ways a kernel may lay them out): softmax along the rows
    (long staged reduces) and log_softmax down the columns (70,001 outputs), values and gradients (their own backward
    steps) against torch, with a NaN in one row, a row all -inf and -inf scattered in another."""
    values = random_array((150, 70_001), low=-30, high=30, seed=11)
    values[0, 12_345] = np.nan
    values[1, :] = -np.inf
    values[2, ::7] = -np.inf
    weights = random_array(values.shape, seed=12)
    x, tx = pair(values, device, requires_grad=True)
    w, tw = pair(weights, device)
    softmax, expected_softmax = x.softmax(-1), tx.softmax(-1)
    log_softmax, expected_log_softmax = x.log_softmax(0), tx.log_softmax(0)
    ((softmax + log_softmax) * w).sum().backward()
    ((expected_softmax + expected_log_softmax) * tw).sum().backward()
    assert_close(softmax, expected_softmax, atol=1e-9, rtol=1e-4)
    assert_close(log_softmax, expected_log_softmax, atol=1e-4, rtol=1e-5)
    assert_close(x.grad, tx.grad, atol=1e-5, rtol=1e-4)
