"""Each mistake raises, in ember, an instance of the exception class PyTorch raises for it, so `except RuntimeError`
(or IndexError, TypeError, ValueError) written for torch catches ember's error too.

Every case is run on torch (the truth) and on ember with the same code: `m` is the module (torch or ember), `F` its
nn.functional and `d` the device. torch's NotImplementedError for an unsupported dtype is a RuntimeError subclass;
ember raises its DTypeError, a RuntimeError, there (so `except RuntimeError` catches both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as TF

import ember as em
import ember.nn.functional as EF


def _x(m: Any, d: str) -> Any:
    return m.ones(2, 3, device=d)


def _i(m: Any, d: str) -> Any:
    return m.ones(2, 3, dtype=m.int64, device=d)


def _b(m: Any, d: str) -> Any:
    return m.ones(2, 3, dtype=m.bool, device=d)


CASES: dict[str, Callable[[Any, Any, str], Any]] = {
    # movement
    "permute: wrong number of dims": lambda m, F, d: _x(m, d).permute(0),
    "permute: repeated dim": lambda m, F, d: _x(m, d).permute(0, 0),
    "permute: dim out of range": lambda m, F, d: _x(m, d).permute(0, 5),
    "flip: dim out of range": lambda m, F, d: _x(m, d).flip(5),
    "flip: repeated dim": lambda m, F, d: _x(m, d).flip(0, 0),
    "roll: shifts and dims differ in length": lambda m, F, d: _x(m, d).roll((1, 2), (0,)),
    "roll: dim out of range": lambda m, F, d: _x(m, d).roll(1, 5),
    "view: wrong element count": lambda m, F, d: _x(m, d).view(4),
    "view: two -1": lambda m, F, d: _x(m, d).view(-1, -1),
    "reshape: wrong element count": lambda m, F, d: _x(m, d).reshape(4),
    "reshape: negative size": lambda m, F, d: _x(m, d).reshape(-2, 3),
    "expand: non-singleton dim": lambda m, F, d: _x(m, d).expand(3, 3),
    "expand: fewer dims": lambda m, F, d: _x(m, d).expand(3),
    "cat: shapes differ": lambda m, F, d: m.cat([_x(m, d), m.ones(3, 3, device=d)], 1),
    "cat: ranks differ": lambda m, F, d: m.cat([_x(m, d), m.ones(3, device=d)]),
    "cat: no tensors": lambda m, F, d: m.cat([]),
    "stack: shapes differ": lambda m, F, d: m.stack([_x(m, d), m.ones(3, 3, device=d)]),
    "split: sections do not sum": lambda m, F, d: _x(m, d).split([1, 1], 1),
    "chunk: zero chunks": lambda m, F, d: _x(m, d).chunk(0),
    "tensor_split: zero sections": lambda m, F, d: _x(m, d).tensor_split(0),
    "narrow: out of range": lambda m, F, d: _x(m, d).narrow(1, 2, 5),
    "select: index out of range": lambda m, F, d: _x(m, d).select(0, 5),
    "repeat: fewer counts than dims": lambda m, F, d: _x(m, d).repeat(2),
    "unflatten: sizes do not multiply": lambda m, F, d: _x(m, d).unflatten(1, (2, 2)),
    "movedim: repeated destination": lambda m, F, d: _x(m, d).movedim((0, 1), (0, 0)),
    "squeeze: dim out of range": lambda m, F, d: _x(m, d).squeeze(5),
    "unsqueeze: dim out of range": lambda m, F, d: _x(m, d).unsqueeze(5),
    "transpose: dim out of range": lambda m, F, d: _x(m, d).transpose(0, 5),
    "pad: odd length": lambda m, F, d: F.pad(_x(m, d), (1,)),
    "pad: unknown mode": lambda m, F, d: F.pad(_x(m, d), (1, 1), mode="bad"),
    "tril: 1-d input": lambda m, F, d: m.ones(3, device=d).tril(),
    "index: out of bounds": lambda m, F, d: _x(m, d)[5],
    # indexing
    "gather: index rank differs": lambda m, F, d: _x(m, d).gather(1, m.zeros(2, dtype=m.int64, device=d)),
    "gather: float index": lambda m, F, d: _x(m, d).gather(1, m.zeros(2, 3, device=d)),
    "gather: dim out of range": lambda m, F, d: _x(m, d).gather(3, _i(m, d)),
    "index_select: float index": lambda m, F, d: _x(m, d).index_select(0, m.zeros(1, device=d)),
    "take_along_dim: rank differs": lambda m, F, d: _x(m, d).take_along_dim(m.zeros(2, dtype=m.int64, device=d), 1),
    "scatter_reduce: unknown reduce": lambda m, F, d: _x(m, d).scatter_reduce(1, _i(m, d), _x(m, d), reduce="bad"),
    "scatter: unknown reduce": lambda m, F, d: _x(m, d).scatter(1, _i(m, d), _x(m, d), reduce="bad"),
    "masked_fill: float mask": lambda m, F, d: _x(m, d).masked_fill(_x(m, d), 0),
    "masked_fill: mask shape": lambda m, F, d: _x(m, d).masked_fill(m.ones(3, 3, dtype=m.bool, device=d), 0),
    "where: float condition": lambda m, F, d: m.where(_x(m, d), _x(m, d), _x(m, d)),
    "index_put: float index": lambda m, F, d: _x(m, d).index_put_((m.zeros(1, device=d),), m.ones(1, device=d)),
    "one_hot: float input": lambda m, F, d: F.one_hot(_x(m, d)),
    "embedding: float indices": lambda m, F, d: F.embedding(_x(m, d), _x(m, d)),
    # linear algebra and convolution
    "einsum: sizes differ": lambda m, F, d: m.einsum("ij,jk->ik", _x(m, d), _x(m, d)),
    "einsum: too few operands": lambda m, F, d: m.einsum("ij,jk->ik", _x(m, d)),
    "einsum: unknown output subscript": lambda m, F, d: m.einsum("ij->ik", _x(m, d)),
    "matmul: inner dims differ": lambda m, F, d: _x(m, d) @ _x(m, d),
    "matmul: 0-d operand": lambda m, F, d: m.tensor(1.0, device=d) @ _x(m, d),
    "matmul: dtypes differ": lambda m, F, d: _x(m, d) @ m.ones(3, 2, dtype=m.float64, device=d),
    "mm: inner dims differ": lambda m, F, d: _x(m, d).mm(_x(m, d)),
    "bmm: 2-d operands": lambda m, F, d: _x(m, d).bmm(_x(m, d)),
    "dot: sizes differ": lambda m, F, d: m.ones(3, device=d).dot(m.ones(4, device=d)),
    "dot: dtypes differ": lambda m, F, d: m.ones(3, device=d).dot(m.ones(3, dtype=m.float64, device=d)),
    "outer: 2-d operand": lambda m, F, d: _x(m, d).outer(_x(m, d)),
    "linear: shapes differ": lambda m, F, d: F.linear(_x(m, d), m.ones(4, 4, device=d)),
    "conv2d: channels differ": lambda m, F, d: F.conv2d(m.ones(1, 2, 5, 5, device=d), m.ones(3, 4, 3, 3, device=d)),
    "conv2d: 2-d input": lambda m, F, d: F.conv2d(m.ones(5, 5, device=d), m.ones(3, 4, 3, 3, device=d)),
    "conv2d: kernel larger than input": lambda m, F, d: F.conv2d(m.ones(1, 4, 2, 2, device=d),
                                                                  m.ones(3, 4, 3, 3, device=d)),
    "max_pool2d: output empty": lambda m, F, d: F.max_pool2d(m.ones(1, 1, 2, 2, device=d), 3),
    # arithmetic and elementwise
    "div: unknown rounding_mode": lambda m, F, d: m.div(_x(m, d), _x(m, d), rounding_mode="bad"),
    "div method: unknown rounding_mode": lambda m, F, d: _x(m, d).div(2, rounding_mode="round"),
    "clip: no bounds": lambda m, F, d: _x(m, d).clip(None, None),
    "clamp: no bounds": lambda m, F, d: m.clamp(_x(m, d), None, None),
    "pow: integer to negative integer power": lambda m, F, d: _i(m, d) ** -1,
    "pow: integer to negative power, function form": lambda m, F, d: m.pow(_i(m, d), -2),
    "add: shapes do not broadcast": lambda m, F, d: _x(m, d) + m.ones(4, device=d),
    "lerp: shapes do not broadcast": lambda m, F, d: _x(m, d).lerp(m.ones(4, device=d), 0.5),
    "sub: bool operands": lambda m, F, d: _b(m, d) - _b(m, d),
    "neg: bool operand": lambda m, F, d: -_b(m, d),
    "abs: bool operand": lambda m, F, d: _b(m, d).abs(),
    "floor_divide: bool operands": lambda m, F, d: _b(m, d) // _b(m, d),
    "remainder: bool operands": lambda m, F, d: _b(m, d) % _b(m, d),
    "pow: bool operands": lambda m, F, d: _b(m, d) ** _b(m, d),
    "relu: bool operand": lambda m, F, d: _b(m, d).relu(),
    "frac: integer operand": lambda m, F, d: _i(m, d).frac(),
    "bitwise_and: float operands": lambda m, F, d: _x(m, d) & _x(m, d),
    "shift: float operand": lambda m, F, d: _x(m, d) << 1,
    "add_: result cannot be cast": lambda m, F, d: _i(m, d).add_(_x(m, d)),
    "add_: result does not fit": lambda m, F, d: m.ones(3, device=d).add_(_x(m, d)),
    "gelu: unknown approximate": lambda m, F, d: F.gelu(_x(m, d), approximate="bad"),
    "view as a dtype of another size": lambda m, F, d: _x(m, d).view(m.float64),
    # reductions
    "sum: dim out of range": lambda m, F, d: _x(m, d).sum(5),
    "sum: repeated dim": lambda m, F, d: _x(m, d).sum((0, 0)),
    "softmax: dim out of range": lambda m, F, d: _x(m, d).softmax(5),
    "cumsum: dim out of range": lambda m, F, d: _x(m, d).cumsum(5),
    "logsumexp: dim out of range": lambda m, F, d: _x(m, d).logsumexp(5),
    "count_nonzero: dim out of range": lambda m, F, d: _x(m, d).count_nonzero(5),
    "mean: integer input": lambda m, F, d: _i(m, d).mean(),
    "std: integer input": lambda m, F, d: _i(m, d).std(),
    "argmax: bool input": lambda m, F, d: _b(m, d).argmax(),
    "max: zero-size dim": lambda m, F, d: m.ones(0, 3, device=d).max(0),
    "amax: zero-size dim": lambda m, F, d: m.ones(0, 3, device=d).amax(0),
    "argmax: empty tensor": lambda m, F, d: m.ones(0, device=d).argmax(),
    "sum: float dim": lambda m, F, d: _x(m, d).sum(1.5),
    # conversion and autograd
    "item: several elements": lambda m, F, d: _x(m, d).item(),
    "bool: several elements": lambda m, F, d: bool(_x(m, d)),
    "requires_grad_: integer tensor": lambda m, F, d: _i(m, d).requires_grad_(),
    "to: unknown device": lambda m, F, d: _x(m, d).to("nope"),
    # nn.functional
    "layer_norm: shape differs": lambda m, F, d: F.layer_norm(_x(m, d), (4,)),
    "batch_norm: running_mean size": lambda m, F, d: F.batch_norm(_x(m, d), m.ones(4, device=d), m.ones(4, device=d)),
    "group_norm: groups do not divide channels": lambda m, F, d: F.group_norm(_x(m, d), 2),
    "cross_entropy: batch sizes differ": lambda m, F, d: F.cross_entropy(_x(m, d), m.tensor([0, 1, 1], device=d)),
    "mse_loss: unknown reduction": lambda m, F, d: F.mse_loss(_x(m, d), _x(m, d), reduction="bad"),
    "dropout: probability above 1": lambda m, F, d: F.dropout(_x(m, d), 2.0),
    "hardtanh: min above max": lambda m, F, d: F.hardtanh(_x(m, d), 2, 1),
    "scaled_dot_product_attention: shapes differ": lambda m, F, d: F.scaled_dot_product_attention(
        m.ones(2, 3, device=d), m.ones(2, 4, device=d), m.ones(2, 4, device=d)),
    # creation and random numbers
    "randint: high not above low": lambda m, F, d: m.randint(5, 3, (2,), device=d),
    "arange: zero step": lambda m, F, d: m.arange(0, 5, 0, device=d),
    "linspace: negative steps": lambda m, F, d: m.linspace(0, 1, -1, device=d),
    "zeros: negative size": lambda m, F, d: m.zeros(-1, device=d),
    "full: negative size": lambda m, F, d: m.full((-1,), 1.0, device=d),
    "eye: negative size": lambda m, F, d: m.eye(-1, device=d),
    "new_full: negative size": lambda m, F, d: _x(m, d).new_full((-1,), 1.0),
    "new_zeros: negative size": lambda m, F, d: _x(m, d).new_zeros(-1),
    "copy_: shape does not broadcast": lambda m, F, d: _x(m, d).copy_(m.ones(4, device=d)),
    "type_as: not a tensor": lambda m, F, d: _x(m, d).type_as(3),
    "stride: dim out of range": lambda m, F, d: _x(m, d).stride(5),
    "uniform_: from above to": lambda m, F, d: _x(m, d).uniform_(2, 1),
    "normal_: negative std": lambda m, F, d: _x(m, d).normal_(0, -1),
    "multinomial: negative probability": lambda m, F, d: m.multinomial(m.tensor([-1.0, 1.0], device=d), 1),
    "multinomial: zero probabilities": lambda m, F, d: m.multinomial(m.tensor([0.0, 0.0], device=d), 1),
    "multinomial: too many samples without replacement": lambda m, F, d: m.multinomial(
        m.tensor([1.0, 1.0], device=d), 3),
    "multinomial: 3-d input": lambda m, F, d: m.multinomial(m.ones(2, 2, 2, device=d), 1),
    "bernoulli: probability above 1": lambda m, F, d: m.bernoulli(m.tensor([2.0], device=d)),
    "bernoulli_: probability below 0": lambda m, F, d: _x(m, d).bernoulli_(-0.5),
}


def _torch_error(case: str) -> type[BaseException]:
    """The class torch raises for the case (NotImplementedError counted as its base, RuntimeError)."""
    with pytest.raises(Exception) as raised:
        CASES[case](torch, TF, "cpu")
    return RuntimeError if raised.type is NotImplementedError else raised.type


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter:UserWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_error_class_matches_torch(case: str, device: str) -> None:
    expected = _torch_error(case)
    with pytest.raises(Exception) as raised:
        CASES[case](em, EF, device)
    assert isinstance(raised.value, expected), (
        f"{case}: ember raised {type(raised.value).__name__} ({raised.value}), not an instance of torch's "
        f"{expected.__name__}"
    )
    assert str(raised.value), f"{case}: the error has no message"


# the cases issue 11 names: torch raises RuntimeError for each, so `except RuntimeError` must catch ember's too
RUNTIME_ERROR_CASES = [
    "permute: wrong number of dims", "permute: repeated dim", "flip: repeated dim",
    "roll: shifts and dims differ in length", "gather: index rank differs", "einsum: sizes differ",
    "conv2d: channels differ", "div: unknown rounding_mode",
    "scatter_reduce: unknown reduce", "scatter: unknown reduce", "clip: no bounds", "clamp: no bounds",
    "pow: integer to negative integer power", "pow: integer to negative power, function form",
]


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter:UserWarning")
@pytest.mark.parametrize("case", RUNTIME_ERROR_CASES)
def test_runtime_error_where_torch_raises_one(case: str, device: str) -> None:
    assert issubclass(_torch_error(case), RuntimeError), case
    with pytest.raises(RuntimeError) as raised:
        CASES[case](em, EF, device)
    assert isinstance(raised.value, em.EmberError) and str(raised.value)


def test_error_class_bases() -> None:
    """The classes themselves: torch's class first, the Python convention (ValueError/TypeError) kept."""
    assert issubclass(em.ShapeError, RuntimeError) and issubclass(em.ShapeError, ValueError)
    assert issubclass(em.DTypeError, RuntimeError) and issubclass(em.DTypeError, TypeError)
    assert issubclass(em.ArgumentError, RuntimeError) and issubclass(em.ArgumentError, ValueError)
    assert issubclass(em.AxisError, IndexError)
    for error in (em.ShapeError, em.DTypeError, em.ArgumentError, em.AxisError, em.DeviceError):
        assert issubclass(error, em.EmberError)
