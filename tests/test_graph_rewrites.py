"""Graph rewrites (scheduler/graph_rewrite.py, graph_rules.py): each rule against torch at NaN, inf, -0.0 and integer
wrap-around, with rewrites on and off in one process (settings.CONFIG.rewrites); kernel and FLOP counts of the
programs before and after; identities that are not exact are left alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

import ember as em
from ember.core.ops import Op
from ember.core.staged_reduce import STAGE_THRESHOLD
from ember.scheduler.graph_rewrite import rewrite_graph
from ember.scheduler.placement import place_graph
from ember.scheduler.program import Launch
from ember.scheduler.schedule import SCHEDULES
from ember.settings import CONFIG

EDGES = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25, 3e38, 1e-45, -7.0], dtype=np.float32)


@pytest.fixture(params=[True, False], ids=["rewrites", "plain"])
def rewrites(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Each test once with graph rewrites and once without (the schedule cache drops programs made the other way)."""
    monkeypatch.setattr(CONFIG, "rewrites", request.param)
    yield request.param


def _bits_equal(result: em.Tensor, expected: torch.Tensor) -> None:
    """Equal values, NaN where torch has NaN and the same sign on zeros."""
    got, want = result.numpy(), expected.numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if got.dtype.kind == "f":
        zeros = want == 0
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))


def _program_counts(*tensors: em.Tensor) -> tuple[int, int]:
    """Realize `tensors` and return the kernels and FLOPs of the program that ran (per element: one per elementwise
    op, one per element a reduce reads)."""
    em.realize(*tensors)
    program = SCHEDULES.entries[SCHEDULES.last_key]
    launches = [step for step in program.steps if isinstance(step, Launch)]
    return len(launches), sum(launch.kernel.flops for launch in launches)


def _counts_both_ways(build: Callable[[], list[em.Tensor]],
                      monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[int, int], tuple[int, int]]:
    """(kernels, FLOPs) of the graph `build` makes, with rewrites off and then on."""
    monkeypatch.setattr(CONFIG, "rewrites", False)
    before = _program_counts(*build())
    monkeypatch.setattr(CONFIG, "rewrites", True)
    after = _program_counts(*build())
    return before, after


def _fired(*tensors: em.Tensor) -> dict[str, int]:
    """The rules that fire on the graph under `tensors` (not realized)."""
    roots = [tensor.node for tensor in tensors]
    rewritten = rewrite_graph(place_graph(roots), roots)
    return {} if rewritten is None else rewritten.fired


# ---- identities, against torch at edge values ------------------------------------------------------------------


def test_multiply_and_divide_by_one_keep_every_value(device: str, rewrites: bool) -> None:
    x, tx = em.tensor(EDGES, device=device), torch.tensor(EDGES)
    result = (x.neg() * 1.0 / 1.0).neg()
    assert "x * 1" in _fired(result)
    _bits_equal(result, (tx.neg() * 1.0 / 1.0).neg())


def test_adding_negative_zero_is_dropped_but_positive_zero_is_not(device: str, rewrites: bool) -> None:
    x, tx = em.tensor(EDGES, device=device), torch.tensor(EDGES)
    kept = (x.neg() + 0.0).neg()  # -0.0 + 0.0 is +0.0: not an identity
    dropped = (x.neg() + (-0.0)).neg()
    assert "x + 0 (integers), x + -0.0" not in _fired(kept)
    assert _fired(dropped).get("x + 0 (integers), x + -0.0") == 1
    _bits_equal(kept, (tx.neg() + 0.0).neg())
    _bits_equal(dropped, (tx.neg() + (-0.0)).neg())
    subtracted = (x.neg() - 0.0).neg()  # x - (+0.0) is x + (-0.0): exact
    _bits_equal(subtracted, (tx.neg() - 0.0).neg())


def test_integer_identities_wrap_like_torch(device: str, rewrites: bool) -> None:
    values = np.array([2**31 - 1, -2**31, 0, -1, 12345], dtype=np.int32)
    x, tx = em.tensor(values, device=device), torch.tensor(values)
    y = x * 3  # an op below, so the identities apply inside the graph
    ty = tx * 3
    _bits_equal((y - y) + (y * 0) + (y + 0) - 0, (ty - ty) + (ty * 0) + (ty + 0) - 0)
    _bits_equal(0 - y, 0 - ty)
    assert {"x - x (integers)", "x * 0 (integers)"} <= set(_fired((y - y) + (y * 0)))


def test_float_self_subtraction_is_not_rewritten(device: str, rewrites: bool) -> None:
    x, tx = em.tensor(EDGES, device=device), torch.tensor(EDGES)
    y, ty = x * 2, tx * 2
    assert _fired(y - y) == {}
    _bits_equal(y - y, ty - ty)  # inf - inf and NaN - NaN are NaN, not 0
    _bits_equal(y * 0, ty * 0)  # inf * 0 is NaN, -x * 0 is -0.0


def test_exp_of_log_is_not_rewritten(device: str, rewrites: bool) -> None:
    x, tx = em.tensor(EDGES, device=device), torch.tensor(EDGES)
    roundtrip = x.log().exp()
    assert _fired(roundtrip) == {}
    expected = tx.log().exp()
    got = roundtrip.numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected.numpy()))  # NaN for x < 0, as torch


def test_double_negation_and_not(device: str, rewrites: bool) -> None:
    x, tx = em.tensor(EDGES, device=device), torch.tensor(EDGES)
    _bits_equal((x * 2).neg().neg(), (tx * 2).neg().neg())
    integers = np.array([0, -1, 7, -2**31], dtype=np.int32)
    i, ti = em.tensor(integers, device=device), torch.tensor(integers)
    _bits_equal((i + 1).neg().neg(), (ti + 1).neg().neg())  # -(-MIN) wraps back to MIN
    _bits_equal(~~(i + 1), ~~(ti + 1))
    assert _fired((x * 2).neg().neg()).get("-(-x), not(not x)") == 1


def test_logic_with_constant_operands(device: str, rewrites: bool) -> None:
    values = np.array([0, -1, 5, 2**31 - 1, -2**31], dtype=np.int32)
    i, ti = em.tensor(values, device=device), torch.tensor(values)
    y, ty = i + 3, ti + 3
    _bits_equal((y & -1) | 0, (ty & -1) | 0)
    _bits_equal((y ^ 0) & 0, (ty ^ 0) & 0)
    _bits_equal(y | -1, ty | -1)
    mask, tmask = y > 4, ty > 4
    _bits_equal((mask & True) | False, (tmask & True) | False)
    assert _fired((y & -1) | 0).get("x & ones, x & 0, x | 0, x | ones, x ^ 0") == 2


def test_select_on_a_constant_and_casts_that_change_nothing(device: str, rewrites: bool) -> None:
    x, tx = em.tensor(EDGES, device=device), torch.tensor(EDGES)
    condition = em.ones(EDGES.shape, dtype=em.bool, device=device)
    chosen = em.where(condition, x * 2, x.exp().sum() + x)
    _bits_equal(chosen, tx * 2)
    widened = (x * 2).double().float()  # float32 -> float64 -> float32 is exact
    assert "a cast that changes no value" in _fired(widened)
    _bits_equal(widened, (tx * 2).double().float())
    narrowed = (x * 2).half().float()  # rounds: kept
    assert "a cast that changes no value" not in _fired(narrowed)
    _bits_equal(narrowed, (tx * 2).half().float())


# ---- movement chains ------------------------------------------------------------------------------------------


def test_movement_chains_collapse(device: str, rewrites: bool) -> None:
    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    y, ty = x + 1, tx + 1
    chains = [
        (y.permute(2, 0, 1).permute(1, 2, 0), ty.permute(2, 0, 1).permute(1, 2, 0)),
        (y.permute(1, 0, 2).permute(2, 0, 1), ty.permute(1, 0, 2).permute(2, 0, 1)),
        (y.reshape(6, 4).reshape(4, 6).reshape(24), ty.reshape(6, 4).reshape(4, 6).reshape(24)),
        (y.flip(0).flip(0, 2), ty.flip(0).flip(0, 2)),
        (y[:, 1:, 1:][:, :1, 2:], ty[:, 1:, 1:][:, :1, 2:]),
        (y[:1, :1].expand(1, 3, 4).expand(5, 3, 4), ty[:1, :1].expand(1, 3, 4).expand(5, 3, 4)),
    ]
    assert _fired(chains[0][0]).get("permute in order, of a permute") == 2  # composed, then in order
    assert "reshape to the same shape, of a reshape" in _fired(chains[2][0])
    assert "flip of nothing, of a flip" in _fired(chains[3][0])
    assert "shrink to the whole, of a shrink" in _fired(chains[4][0])
    assert "expand to the same shape, of an expand" in _fired(chains[5][0])
    for result, expected in chains:
        _bits_equal(result, expected)


# ---- constant folding -------------------------------------------------------------------------------------------


def test_constant_subgraphs_fold_to_constants_without_memory() -> None:
    ones = em.ones((64, 32), device="c")
    scale = (ones * 3.0 + 1.0).reshape(32, 64).permute(1, 0) * 0.5  # uniform: one CONST
    x = em.tensor(np.arange(64 * 32, dtype=np.float32).reshape(64, 32), device="c")
    result = x * scale
    roots = [result.node]
    rewritten = rewrite_graph(place_graph(roots), roots)
    assert rewritten is not None
    (root,) = rewritten.roots
    assert root.op is Op.MUL and root.srcs[1].op is Op.CONST and root.srcs[1].arg == 2.0
    assert root.srcs[1].shape == (64, 32)  # a scalar broadcast to the shape (a CONST holds no memory)


def test_reduce_of_a_constant_folds_and_removes_its_kernel(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = np.linspace(-3, 3, 40 * 30, dtype=np.float32).reshape(40, 30)
    x, tx = em.tensor(data, device=device), torch.tensor(data)

    def build() -> list[em.Tensor]:
        count = em.ones((40, 30), device=device).sum(1, keepdim=True)  # 30.0 per row, read under a broadcast
        return [x / count + em.full((40, 30), 0.25, device=device).max(0, keepdim=True).values]

    (kernels_before, flops_before), (kernels_after, flops_after) = _counts_both_ways(build, monkeypatch)
    assert kernels_after < kernels_before and flops_after < flops_before
    _bits_equal(build()[0], tx / torch.ones(40, 30).sum(1, keepdim=True) + 0.25)


def test_float_sums_of_constants_fold_only_where_exact() -> None:
    exact = em.full((1 << 20,), 0.75, device="c").sum()  # 3 * 2**-2 summed 2**20 times: every partial sum exact
    inexact = em.full((1 << 25,), 0.1, device="c").sum()  # partial sums round: the order of accumulation matters
    assert "a reduce of a constant" in _fired(exact + 1)
    assert "a reduce of a constant" not in _fired(inexact + 1)
    assert float((exact + 1).item()) == 0.75 * (1 << 20) + 1


def test_integer_reduces_of_constants_wrap_like_torch(device: str, rewrites: bool) -> None:
    total = em.full((1000, 3), 2**62 + 3, dtype=em.int64, device=device).sum(0) + 1
    assert "a reduce of a constant" in _fired(total)
    _bits_equal(total, torch.full((1000, 3), 2**62 + 3, dtype=torch.int64).sum(0) + 1)


# ---- the distributive law --------------------------------------------------------------------------------------


def test_integer_distributive_law_saves_a_multiply_per_element(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    a_data, b_data, c_data = (rng.integers(-2**31, 2**31, (50, 40), dtype=np.int64).astype(np.int32)
                              for _ in range(3))
    a, b, c = (em.tensor(data, device=device) for data in (a_data, b_data, c_data))
    ta, tb, tc = (torch.tensor(data) for data in (a_data, b_data, c_data))

    def build() -> list[em.Tensor]:
        return [a * b + c * a, (a + 1) * b - (a + 1) * c]

    (kernels_before, flops_before), (kernels_after, flops_after) = _counts_both_ways(build, monkeypatch)
    assert kernels_after == kernels_before
    elements = 50 * 40
    assert flops_before == (3 + 5) * elements  # a*b, c*a, + ; a+1 twice, two products, -
    assert flops_after == (2 + 3) * elements  # b+c, a* ; a+1 once (one node for equal ones), b-c, a*
    first, second = build()
    _bits_equal(first, ta * tb + tc * ta)  # products wrap modulo 2**32 either way
    _bits_equal(second, (ta + 1) * tb - (ta + 1) * tc)


def test_float_distributive_law_is_not_applied(device: str, rewrites: bool) -> None:
    finite = np.array([1.5, -2.25, 0.1, 3.0, -0.0, 7.0], dtype=np.float32)
    scaled = [finite * np.float32(scale) for scale in (1.0, 0.3, -1.7)]
    a, b, c = (em.tensor(values, device=device) for values in scaled)
    ta, tb, tc = (torch.tensor(values) for values in scaled)
    result = a * b + a * c
    assert _fired(result) == {}
    np.testing.assert_allclose(result.numpy(), (ta * tb + ta * tc).numpy(), rtol=1e-6)


def test_products_read_elsewhere_are_not_distributed() -> None:
    a, b, c = (em.tensor(np.arange(6, dtype=np.int32) + k, device="c") for k in range(3))
    shared = a * b
    assert _fired(shared + a * c, shared) == {}


# ---- roots, in-place assigns and gradients --------------------------------------------------------------------


def test_a_root_that_rewrites_to_its_source_gets_its_own_buffer(device: str, rewrites: bool) -> None:
    x = em.tensor(EDGES.copy(), device=device)
    lazy = x * 2
    same = lazy * 1.0  # rewrites to `lazy`, another root
    twice = lazy.neg().neg()  # also rewrites to `lazy`
    copy = x * 1.0  # rewrites to x, a realized buffer
    em.realize(lazy, same, twice, copy)
    x.add_(1.0)  # in place: the copy keeps the old values
    expected = torch.tensor(EDGES)
    _bits_equal(copy, expected)
    _bits_equal(same, expected * 2)
    _bits_equal(twice, expected * 2)
    _bits_equal(lazy, expected * 2)


def test_a_root_listed_twice_is_computed_once() -> None:
    x = em.tensor(EDGES, device="c")
    y = (x * 2).neg().neg() * 1.0
    assert _fired(y)
    with em.profile() as record:
        em.realize(y, y)
    assert len(record.kernels) == 1
    _bits_equal(y, torch.tensor(EDGES) * 2)


def test_equal_roots_compute_once_and_copy(device: str) -> None:
    """Two roots of one value (an LSTM's two bias gradients are one sum over every step's gate gradients) are one
    reduce and a copy of its result, each in a buffer of its own."""
    data = np.random.default_rng(3).standard_normal((2048, 512), dtype=np.float32)
    x = em.tensor(data, device=device)
    first, second = x.sum(0), (x * 1.0).sum(0)  # (the second rewrites to the first)
    with em.profile() as record:
        em.realize(first, second)
    reduces = [kernel for kernel in record.kernels if kernel.name.startswith("r_")]
    assert len(reduces) == 1, [kernel.name for kernel in record.kernels]
    expected = torch.from_numpy(data).sum(0)
    np.testing.assert_allclose(first.numpy(), expected.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(second.numpy(), first.numpy())
    first.add_(1.0)  # in place: the other keeps its values
    np.testing.assert_allclose(second.numpy(), expected.numpy(), rtol=1e-4, atol=1e-3)


def test_in_place_multiply_by_one(device: str, rewrites: bool) -> None:
    x = em.tensor(EDGES.copy(), device=device)
    x.mul_(1.0)
    x.neg_()
    x.neg_()
    _bits_equal(x, torch.tensor(EDGES))


def test_backward_graphs_lose_kernels_or_work(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    x_data, w_data = rng.standard_normal((64, 48), dtype=np.float32), rng.standard_normal((48, 32), dtype=np.float32)

    def build() -> list[em.Tensor]:
        x = em.tensor(x_data, device="c", requires_grad=True)
        w = em.tensor(w_data, device="c", requires_grad=True)
        loss = ((x @ w).relu() * 1.0).mean() + (x.t().t() * w.sum()).sum()
        grad_x, grad_w = em.autograd.grad(loss, [x, w])
        return [grad_x, grad_w]

    (kernels_before, flops_before), (kernels_after, flops_after) = _counts_both_ways(build, monkeypatch)
    assert (kernels_after, flops_after) < (kernels_before, flops_before)
    assert kernels_after <= kernels_before and flops_after <= flops_before
    tx = torch.tensor(x_data, requires_grad=True)
    tw = torch.tensor(w_data, requires_grad=True)
    tloss = ((tx @ tw).relu() * 1.0).mean() + (tx.t().t() * tw.sum()).sum()
    expected = torch.autograd.grad(tloss, [tx, tw])
    for got, want in zip(build(), expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_a_gradient_through_a_folded_count_loses_its_reduce_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    x_data = np.random.default_rng(2).standard_normal((64, 48), dtype=np.float32)

    def build() -> list[em.Tensor]:
        x = em.tensor(x_data, device="c", requires_grad=True)
        counts = em.ones((64, 48), device="c").sum(0, keepdim=True)  # 64.0 per column: a reduce kernel
        loss = (x.t().t() / counts).relu().sum() * 1.0
        return list(em.autograd.grad(loss, [x]))

    (kernels_before, flops_before), (kernels_after, flops_after) = _counts_both_ways(build, monkeypatch)
    assert (kernels_before, kernels_after) == (2, 1) and flops_after < flops_before
    tx = torch.tensor(x_data, requires_grad=True)
    (expected,) = torch.autograd.grad((tx.t().t() / torch.ones(64, 48).sum(0, keepdim=True)).relu().sum() * 1.0, [tx])
    _bits_equal(build()[0], expected)


def test_rewrites_setting_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.settings import load_config

    monkeypatch.setenv("EMBER_REWRITES", "0")
    assert load_config().rewrites is False
    monkeypatch.setenv("EMBER_REWRITES", "1")
    assert load_config().rewrites is True
    monkeypatch.delenv("EMBER_REWRITES")
    assert load_config().rewrites is True


def test_a_made_up_node_that_would_be_stored_falls_back_to_the_original_graph(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.scheduler import kernelize

    monkeypatch.setattr(kernelize, "MAX_KERNEL_OPS", 2)  # every second op is stored: b + c of a*(b + c) too
    values = [np.arange(12, dtype=np.int32) * (k + 3) for k in range(3)]
    a, b, c = (em.tensor(v, device="c") for v in values)
    ta, tb, tc = (torch.tensor(v) for v in values)
    result = (a + 1) * (b + 2) + (a + 1) * (c + 3)
    assert "a*b + a*c -> a*(b + c) (integers)" in _fired(result)
    rewritten = SCHEDULES.rewritten
    _bits_equal(result, (ta + 1) * (tb + 2) + (ta + 1) * (tc + 3))
    assert SCHEDULES.rewritten == rewritten  # kernelized as recorded


def test_rewrites_across_devices() -> None:
    from tests.conftest import TEST_DEVICES

    if len(TEST_DEVICES) < 2:
        pytest.skip("needs two devices")
    first, second = TEST_DEVICES[:2]
    x = em.tensor(EDGES, device=first)
    moved = ((x * 1.0).neg().neg() + em.full(EDGES.shape, 2.0, device=first) * 0.5).to(second)
    result = moved * 1.0 + em.tensor(EDGES, device=second).neg().neg()
    tx = torch.tensor(EDGES)
    _bits_equal(result, (tx + 1.0) + tx)


# ---- sums of one-hot selections -------------------------------------------------------------------------------------


def test_a_sum_of_a_one_hot_selection_is_a_select_bit_for_bit(device: str, rewrites: bool) -> None:
    """sum_k where(index == k, x, 0) over k < 5, with indices in range, negative and past the end, and x at NaN,
    inf and -0.0 (whose sum is +0.0): torch's values bit for bit, and, with a mask and-ed in, as torch's too."""
    index_values = np.array([0, 4, -1, 5, 2, 7, 3, 1, 0, -100], dtype=np.int64)
    x, tx = em.tensor(EDGES, device=device), torch.tensor(EDGES)
    index, tindex = em.tensor(index_values, device=device), torch.tensor(index_values)
    classes, tclasses = em.arange(5, device=device), torch.arange(5)
    hits = index.reshape(-1, 1) == classes.reshape(1, -1)
    thits = tindex.reshape(-1, 1) == tclasses.reshape(1, -1)
    summed = em.where(hits, x.neg().reshape(-1, 1), 0.0).sum(1)
    if rewrites:
        assert _fired(summed).get("a sum of a one-hot selection of one value") == 1
    _bits_equal(summed, torch.where(thits, tx.neg().reshape(-1, 1), 0.0).sum(1))
    kept = (index != -100).reshape(-1, 1)
    masked = em.where(hits & kept, x.reshape(-1, 1) * 2.0, 0.0).sum(1, keepdim=True)
    tmasked = torch.where(thits & (tindex != -100).reshape(-1, 1), tx.reshape(-1, 1) * 2.0, 0.0).sum(1, keepdim=True)
    _bits_equal(masked, tmasked)


def test_a_one_hot_selection_of_values_that_differ_per_class_is_left_alone() -> None:
    """sum_k where(index == k, x[k], 0) picks x at the index (lowering gathers it, ir/lower.py): not this rule, whose
    value must be the same for every class; nor a sum whose other branch is -0.0 (each term then may be -0.0)."""
    index = em.tensor(np.array([0, 2, 1], dtype=np.int64)).reshape(-1, 1)
    table = em.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    hits = index == em.arange(4).reshape(1, -1)
    picked = em.where(hits, table, 0.0).sum(1)
    negative_zero = em.where(hits, em.tensor(np.ones((3, 1), np.float32)), -0.0).sum(1)
    assert "a sum of a one-hot selection of one value" not in _fired(picked, negative_zero)
    np.testing.assert_array_equal(picked.numpy(), [0.0, 6.0, 9.0])
    np.testing.assert_array_equal(negative_zero.numpy(), [1.0, 1.0, 1.0])


def test_cross_entropy_gradients_lose_their_loop_over_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A classifier's cross-entropy gradient (class indices, some ignored) sums its one-hot target over 88 classes:
    with the rule, no work per class for that sum; the gradient as torch's."""
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((256, 88), dtype=np.float32)
    targets = rng.integers(0, 88, size=256)
    targets[::7] = -100

    def build() -> list[em.Tensor]:
        x = em.tensor(logits, device="c", requires_grad=True)
        loss = em.nn.functional.cross_entropy(x, em.tensor(targets, device="c"), ignore_index=-100)
        return list(em.autograd.grad(loss, [x]))

    (_, flops_before), (_, flops_after) = _counts_both_ways(build, monkeypatch)
    assert flops_after < flops_before - 256 * 70, (flops_before, flops_after)  # (a compare, an and, a select per class)
    tx = torch.tensor(logits, requires_grad=True)
    (expected,) = torch.autograd.grad(torch.nn.functional.cross_entropy(tx, torch.tensor(targets)), [tx])
    np.testing.assert_allclose(build()[0].numpy(), expected.numpy(), rtol=1e-5, atol=1e-7)


def test_one_hot_sums_over_more_classes_than_65535(rewrites: bool) -> None:
    """A cross-entropy gradient over 70,000 classes (a language model's vocabulary), targets at the first and last
    class and ignored ones, as torch's with the rule and without."""
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((6, 70_000), dtype=np.float32)
    targets = np.array([0, 69_999, -100, 12_345, 69_998, -100])
    x = em.tensor(logits, requires_grad=True)
    loss = em.nn.functional.cross_entropy(x, em.tensor(targets), ignore_index=-100)
    (grad,) = em.autograd.grad(loss, [x])  # (realized: its graph is gone, so the rule is checked on the sum below)
    tx = torch.tensor(logits, requires_grad=True)
    (expected,) = torch.autograd.grad(torch.nn.functional.cross_entropy(tx, torch.tensor(targets)), [tx])
    np.testing.assert_allclose(grad.numpy(), expected.numpy(), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(loss.item(), torch.nn.functional.cross_entropy(tx, torch.tensor(targets)).item(),
                               rtol=1e-6)
    # the rule on the one-hot sum itself, at 16,384 classes and past staged_reduce.STAGE_THRESHOLD, where a long sum
    # is recorded as stages of partial sums but a one-hot one is kept whole (exact in any order) for the rule to see;
    # torch's values bit for bit at both
    for classes in (STAGE_THRESHOLD, 70_000):
        index, values = em.tensor(targets % classes), em.tensor(logits[:, :1].copy())
        hits = (index.reshape(-1, 1) == em.arange(classes).reshape(1, -1)) & (em.tensor(targets) != -100).reshape(-1, 1)
        summed = em.where(hits, values, 0.0).sum(1)
        fired = _fired(summed).get("a sum of a one-hot selection of one value")
        assert fired == 1, (classes, fired)  # (_fired: rewrites on)
        tindex = torch.tensor(targets % classes)
        thits = (tindex.reshape(-1, 1) == torch.arange(classes).reshape(1, -1)) & (
            torch.tensor(targets) != -100).reshape(-1, 1)
        _bits_equal(summed, torch.where(thits, torch.tensor(logits[:, :1].copy()), 0.0).sum(1))
