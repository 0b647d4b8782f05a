"""Indices read from data are checked (IndexError naming the value, its position and the valid range, as torch
raises) and integer division by zero raises torch's ZeroDivisionError: at the call for host data, and for computed
indices when a value computed from them is first read (core/checks.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember as em
import ember.nn.functional as F
from ember.core.checks import IndexOutOfRangeError, IntegerDivisionByZeroError
from ember.testing.reference import ReferenceTensor
from tests.helpers import assert_close

# each case: (name, function(module, tensor maker, x 2x3 float, functional module) -> result)
# a tensor maker builds an index tensor from a list; `x` is [[0, 1, 2], [3, 4, 5]]
Case = Callable[[Any, Callable[[Any], Any], Any, Any], Any]

OUT_OF_RANGE: list[tuple[str, Case, str]] = [
    ("gather", lambda m, make, x, f: x.gather(1, make([[0, 7]])), "7"),
    ("gather negative", lambda m, make, x, f: x.gather(1, make([[0, -1]])), "-1"),
    ("advanced get", lambda m, make, x, f: x[make([5])], "5"),
    ("advanced get too negative", lambda m, make, x, f: x[:, make([-4])], "-4"),
    ("advanced set", lambda m, make, x, f: x.index_put((make([0, 2]),), m.tensor(1.0)), "2"),
    ("advanced accumulate", lambda m, make, x, f: x.index_put((make([9]),), m.tensor(1.0), accumulate=True), "9"),
    ("index_select", lambda m, make, x, f: x.index_select(1, make([1, 5])), "5"),
    ("index_select negative", lambda m, make, x, f: x.index_select(1, make([-1])), "-1"),
    ("take", lambda m, make, x, f: x.take(make([9])), "9"),
    ("take too negative", lambda m, make, x, f: x.take(make([-7])), "-7"),
    ("put", lambda m, make, x, f: x.put(make([6]), m.tensor([1.0])), "6"),
    ("scatter", lambda m, make, x, f: x.scatter(1, make([[9]]), m.tensor([[1.0]])), "9"),
    ("scatter negative", lambda m, make, x, f: x.scatter(1, make([[-1]]), m.tensor([[1.0]])), "-1"),
    ("scatter_add", lambda m, make, x, f: x.scatter_add(0, make([[3]]), m.tensor([[1.0]])), "3"),
    ("scatter_reduce", lambda m, make, x, f: x.scatter_reduce(1, make([[3]]), m.tensor([[1.0]]), "amax"), "3"),
    ("index_add", lambda m, make, x, f: x.index_add(1, make([3]), m.ones(2, 1)), "3"),
    ("index_add negative", lambda m, make, x, f: x.index_add(1, make([-1]), m.ones(2, 1)), "-1"),
    ("index_copy", lambda m, make, x, f: x.index_copy(0, make([2]), m.ones(1, 3)), "2"),
    ("index_fill", lambda m, make, x, f: x.index_fill(1, make([3]), 1.0), "3"),
    ("index_fill too negative", lambda m, make, x, f: x.index_fill(1, make([-4]), 1.0), "-4"),
    ("embedding", lambda m, make, x, f: f.embedding(make([1, 100]), m.zeros(10, 3)), "100"),
    ("embedding negative", lambda m, make, x, f: f.embedding(make([-1]), m.zeros(10, 3)), "-1"),
    ("embedding_bag", lambda m, make, x, f: f.embedding_bag(make([100]), m.zeros(10, 3), make([0])), "100"),
    ("cross_entropy", lambda m, make, x, f: f.cross_entropy(x, make([1, 5])), "5"),
    ("cross_entropy negative", lambda m, make, x, f: f.cross_entropy(x, make([-1, 0])), "-1"),
    ("nll_loss", lambda m, make, x, f: f.nll_loss(x, make([3, 0])), "3"),
    ("multi_margin_loss", lambda m, make, x, f: f.multi_margin_loss(x, make([0, 3])), "3"),
    ("one_hot", lambda m, make, x, f: f.one_hot(make([5]), 3), "5"),
    ("one_hot negative", lambda m, make, x, f: f.one_hot(make([-1]), 3), "-1"),
]

IN_RANGE: list[tuple[str, Case]] = [
    ("gather", lambda m, make, x, f: x.gather(1, make([[2, 0], [1, 1]]))),
    ("advanced get negative", lambda m, make, x, f: x[make([-1, 0]), make([-3, 2])]),
    ("advanced set negative", lambda m, make, x, f: x.index_put((make([-1]), make([-2])), m.tensor(9.0))),
    ("index_select", lambda m, make, x, f: x.index_select(1, make([2, 0, 2]))),
    ("take negative", lambda m, make, x, f: x.take(make([-1, 0, -6]))),
    ("put negative", lambda m, make, x, f: x.put(make([-1, 1]), m.tensor([7.0, 8.0]))),
    ("scatter_add", lambda m, make, x, f: x.scatter_add(1, make([[2, 2]]), m.tensor([[1.0, 2.0]]))),
    ("index_fill negative", lambda m, make, x, f: x.index_fill(1, make([-1]), 1.0)),
    ("index_add", lambda m, make, x, f: x.index_add(1, make([2, 0]), m.ones(2, 2))),
    ("embedding", lambda m, make, x, f: f.embedding(make([[9, 0]]), m.arange(30.0).reshape(10, 3))),
    ("cross_entropy ignore_index", lambda m, make, x, f: f.cross_entropy(x, make([-100, 2]))),
    ("nll_loss ignore_index", lambda m, make, x, f: f.nll_loss(x, make([7, 1]), ignore_index=7)),
    ("one_hot", lambda m, make, x, f: f.one_hot(make([2, 0]), 3)),
]


def _x(module: Any, device: str | None = None) -> Any:
    values = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    return module.tensor(values) if device is None else module.tensor(values, device=device)


def _host(device: str) -> Callable[[Any], em.Tensor]:
    return lambda values: em.tensor(values, device=device)


def _computed(device: str) -> Callable[[Any], em.Tensor]:
    """Index tensors computed on the device (their values are not known on the host when an op is recorded)."""
    return lambda values: em.tensor(values, device=device) * 1


@pytest.mark.parametrize("name, case, value", OUT_OF_RANGE, ids=[case[0] for case in OUT_OF_RANGE])
def test_out_of_range_index_raises_like_torch(device: str, name: str, case: Case, value: str) -> None:
    with pytest.raises((IndexError, RuntimeError)):  # torch raises too (IndexError or RuntimeError by op)
        case(torch, torch.tensor, _x(torch), TF)
    # host data: raised at the call, naming the value, the position in the index and the valid range
    with pytest.raises(IndexError, match=rf"(index|Target) {value}\b.*at position \(.*out of bounds.*\[") as raised:
        case(em, _host(device), _x(em, device), F)
    assert isinstance(raised.value, RuntimeError)  # the builtin class torch raises for gather/scatter/one_hot too
    # a computed index: nothing is read when the op is recorded; the first read raises the same message
    result = case(em, _computed(device), _x(em, device), F)
    with pytest.raises(IndexError, match=rf"(index|Target) {value}\b.*out of bounds") as lazily:
        result.numpy()
    assert str(lazily.value) == str(raised.value)


@pytest.mark.parametrize("name, case", IN_RANGE, ids=[case[0] for case in IN_RANGE])
def test_in_range_index_matches_torch(device: str, name: str, case: Case) -> None:
    expected = case(torch, torch.tensor, _x(torch), TF)
    for make in (_host(device), _computed(device)):
        assert_close(case(em, make, _x(em, device), F), expected, check_dtype=False)


def test_take_along_dim_checks_where_torch_does_not(device: str) -> None:
    """torch's take_along_dim reads out of bounds without an error (its result is whatever memory holds); ember
    raises as its gather does."""
    with pytest.raises(IndexError, match=r"gather: index 7 at position \(0, 1\).*dimension 1 with size 3"):
        _x(em, device).take_along_dim(em.tensor([[0, 7]], device=device), 1).numpy()
    assert_close(_x(em, device).take_along_dim(em.tensor([[2], [0]], device=device) * 1, 1),
                 _x(torch).take_along_dim(torch.tensor([[2], [0]]), 1))


def test_the_error_fires_when_a_downstream_value_is_read(device: str) -> None:
    x = em.arange(12.0, device=device).reshape(3, 4)
    bad = em.tensor([[0, 1, 2, 3], [0, 4, 1, 2]], device=device) * 1  # 4 at position (1, 1)
    gathered = x.gather(1, bad)  # recorded: no error, nothing read
    downstream = ((gathered * 2).exp() + 1).sum(0)
    other = gathered.mean()
    with pytest.raises(IndexError, match=r"gather: index 4 at position \(1, 1\).*dimension 1 with size 4"):
        downstream.tolist()
    for tensor in (gathered, other, downstream, downstream + 1):  # every later read raises again
        with pytest.raises(IndexError, match="index 4"):
            tensor.numpy()
    with pytest.raises(IndexError, match="index 4"):
        em.realize(x + 1, other)
    assert (x + 1).tolist() == (torch.arange(12.0).reshape(3, 4) + 1).tolist()  # unrelated values are fine


def test_a_passed_check_leaves_nothing_behind(device: str) -> None:
    x = em.arange(12.0, device=device).reshape(3, 4)
    index = em.tensor([[3, 0], [1, 2], [0, 0]], device=device) * 1
    gathered = x.gather(1, index)
    assert gathered.tolist() == [[3.0, 0.0], [5.0, 6.0], [8.0, 8.0]]
    assert gathered.node.checks is None  # realized and passed: later ops carry no check
    assert (gathered + 1).node.checks is None


def test_gradient_through_a_checked_gather(device: str) -> None:
    x = em.arange(6.0, device=device).reshape(2, 3).requires_grad_()
    good = x.gather(1, em.tensor([[2, 2], [0, 1]], device=device) * 1)
    good.sum().backward()
    tx = torch.arange(6.0).reshape(2, 3).requires_grad_()
    tx.gather(1, torch.tensor([[2, 2], [0, 1]])).sum().backward()
    assert_close(x.grad, tx.grad)
    y = em.arange(6.0, device=device).reshape(2, 3).requires_grad_()
    loss = y.gather(1, em.tensor([[2, 3]], device=device) * 1).sum()
    with pytest.raises(IndexError, match="index 3"):  # backward or the gradient's first read raises, never 0s
        loss.backward()
        assert y.grad is not None
        y.grad.numpy()


def test_in_place_and_data_keep_the_check(device: str) -> None:
    x = em.zeros(4, device=device)
    x.data.scatter_(0, em.tensor([1, 8], device=device) * 1, em.ones(2, device=device))
    with pytest.raises(IndexError, match="index 8"):
        x.numpy()
    y = em.zeros(3, device=device)
    y[em.tensor([0, 3], device=device) * 1] = 1.0  # recorded lazily; the value is read below
    with pytest.raises(IndexError, match="index 3"):
        y.tolist()


def test_many_indices_name_the_first_bad_position(device: str) -> None:
    count, size = 200_000, 300  # past 65,535 indices: the check's own reduce runs in stages
    rng = np.random.default_rng(0)
    values = rng.integers(0, size, count)
    values[[150_001, 190_000]] = [size + 5, -2]
    source = em.arange(float(size), device=device)
    taken = source.gather(0, em.tensor(values, device=device) * 1)
    with pytest.raises(IndexError, match=rf"index {size + 5} at position \(150001,\)"):
        taken.numpy()
    values[[150_001, 190_000]] = 7
    good = source.gather(0, em.tensor(values, device=device) * 1).numpy()
    assert np.array_equal(good, np.arange(float(size), dtype=np.float32)[values])


def test_jit_replay_raises_with_new_bad_inputs(device: str) -> None:
    @em.jit
    def pick(x: em.Tensor, index: em.Tensor) -> em.Tensor:
        return x.gather(0, index) * 2

    x = em.arange(5.0, device=device).realize()
    for values in ([0, 1], [4, 3], [2, 2]):  # the first two calls capture, the third replays
        assert pick(x, em.tensor(values, device=device)).tolist() == [2.0 * v for v in values]
    assert pick.replays == 1
    with pytest.raises(IndexError, match=r"gather: an index at position \(1,\).*size 5.*ember.jit\(pick\)"):
        pick(x, em.tensor([1, 9], device=device))
    assert pick(x, em.tensor([1, 2], device=device)).tolist() == [2.0, 4.0]


@pytest.mark.parametrize("operation", ["floor_divide", "remainder", "fmod", "div_floor", "div_trunc"])
def test_integer_division_by_zero_raises_like_torch(device: str, operation: str) -> None:
    def apply(a: Any, b: Any) -> Any:
        if operation.startswith("div_"):
            return a.div(b, rounding_mode=operation[4:])
        return getattr(a, operation)(b)

    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        apply(torch.tensor([7, -7, 3]), torch.tensor([2, 0, 1]))
    dividend = em.tensor([7, -7, 3], device=device)
    with pytest.raises(IntegerDivisionByZeroError, match=r"ZeroDivisionError.*position \(1,\)") as raised:
        apply(dividend, em.tensor([2, 0, 1], device=device))
    assert isinstance(raised.value, RuntimeError)
    result = apply(dividend, em.tensor([2, 0, 1], device=device) * 1)  # computed divisor: raised at the read
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        result.tolist()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        apply(dividend, 0)
    expected = apply(torch.tensor([7, -7, 3]), torch.tensor([2, -3, 1]))
    assert apply(dividend, em.tensor([2, -3, 1], device=device) * 1).tolist() == expected.tolist()


def test_python_operators_and_float_division(device: str) -> None:
    a = em.tensor([5, 6], dtype=em.int32, device=device)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (a // (a * 0)).tolist()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (7 % (a - 5)).tolist()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.tensor([5, 6], dtype=torch.int32) // 0
    assert (em.tensor([], dtype=em.int64, device=device) // 0).tolist() == []  # torch: nothing to divide
    floats = em.tensor([1.0, -1.0, 0.0], device=device)
    expected = torch.tensor([1.0, -1.0, 0.0])
    assert_close(floats / 0, expected / 0)
    assert_close(floats // 0, expected // 0)
    assert_close(floats % 0, expected % 0)


def test_reference_tensor_raises_the_same_errors() -> None:
    x = ReferenceTensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    for name, case, value in OUT_OF_RANGE:
        if name.startswith(("embedding", "cross_entropy", "nll", "multi_margin", "one_hot")):
            continue  # nn.functional forms are Tensor methods the reference tensor does not have
        with pytest.raises(IndexError, match=rf"(index|Target) {value}\b.*out of bounds"):
            case(_ReferenceModule, ReferenceTensor, x, F)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        ReferenceTensor([1, 2]) // ReferenceTensor([1, 0])


class _ReferenceModule:
    """The few module functions the cases call, making reference tensors."""

    tensor = ReferenceTensor

    @staticmethod
    def ones(*shape: int) -> ReferenceTensor:
        return ReferenceTensor(np.ones(shape, np.float32))

    @staticmethod
    def zeros(*shape: int) -> ReferenceTensor:
        return ReferenceTensor(np.zeros(shape, np.float32))


def test_errors_are_both_builtin_classes() -> None:
    assert issubclass(IndexOutOfRangeError, IndexError) and issubclass(IndexOutOfRangeError, RuntimeError)
    assert issubclass(IntegerDivisionByZeroError, ZeroDivisionError)
    assert issubclass(IntegerDivisionByZeroError, RuntimeError)


def test_cross_entropy_target_check_rides_in_the_step_schedule(device: str) -> None:
    """Targets computed on the device: the check is recorded lazily, evaluated in the one realize that backward
    does (no realize of its own), and the loss read afterwards costs nothing; a bad target raises at that first
    realize, naming the value and its position, as torch names it at the call."""
    logits = em.tensor(np.linspace(-1, 1, 40, dtype=np.float32).reshape(8, 5), device=device, requires_grad=True)
    for _ in range(2):
        targets = em.tensor([0, 1, 2, 3, 4, 0, 1, 2], device=device) * 1
        loss = F.cross_entropy(logits, targets)
        with em.profile() as record:
            loss.backward()
        assert record.realizes == 1
        with em.profile() as record:
            value = loss.item()
        assert record.realizes == 0
        expected = TF.cross_entropy(torch.tensor(logits.detach().numpy()), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2]))
        assert abs(value - expected.item()) < 1e-5
    bad = em.tensor([0, 1, 2, 3, 4, 0, 7, 2], device=device) * 1
    with pytest.raises(IndexError, match=r"Target 7 at position \(6,\).*out of bounds"):
        F.cross_entropy(logits, bad).backward()
    with pytest.raises(IndexError):
        TF.cross_entropy(torch.zeros(8, 5), torch.tensor([0, 1, 2, 3, 4, 0, 7, 2]))
