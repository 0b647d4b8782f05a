"""Gradient fuzzing: random differentiable programs, their input gradients by ember's autograd vs PyTorch's (float64).

Programs are drawn like the forward fuzzer's, from ops PyTorch shares, and only where their derivative is defined
and well conditioned: the generator looks at the reference values and skips log of values near 0, relu near its
kink, max over near-ties and so on. The loss is the sum of each output times fixed weights (cos of the position).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.shapes import broadcast_shapes
from ember.testing.fuzz import Budget, CurrentProgram, EmberMaker, FuzzMismatch, FuzzStats
from ember.testing.program import Call, Program, Ref, Source
from ember.testing.strategies import (ProgramBuilder, broadcast_shape, broadcastable, getitem, matmul_operand_shape, pad,
                                      reshape, shapes)

RELATIVE_TOLERANCE = 2e-3
ABSOLUTE_TOLERANCE = 2e-4  # times the largest gradient magnitude (at least 1)

SMOOTH_UNARY = ["tanh", "sigmoid", "sin", "cos", "square", "__neg__", "silu", "exp", "log", "sqrt", "reciprocal",
                "rsqrt", "relu", "abs", "softplus", "gelu"]
POSITIVE_ONLY = {"log": 0.2, "sqrt": 0.2, "reciprocal": 0.2, "rsqrt": 0.2}  # smallest input allowed
AWAY_FROM_ZERO = {"relu", "abs"}
ARITHMETIC = ["__add__", "__mul__", "__sub__", "__truediv__", "maximum", "minimum", "__pow__"]
REDUCTIONS = ["sum", "mean", "amax", "amin", "logsumexp", "softmax", "log_softmax", "var", "cumsum", "prod"]
MOVEMENT = ["reshape", "permute", "expand", "pad", "getitem", "flip", "transpose", "unsqueeze", "flatten", "narrow"]


def _values(builder: ProgramBuilder, index: int) -> np.ndarray:
    return builder.values[index].numpy().astype(np.float64)


@st.composite
def grad_source(draw: st.DrawFn, builder: ProgramBuilder, shape: tuple[int, ...]) -> int:
    """A float32 input that requires a gradient, with distinct values (no ties) in [-2, 2]."""
    elements = st.floats(-2.0, 2.0, width=32, allow_subnormal=False)
    values = draw(hnp.arrays(np.float32, shape, elements=elements))
    return builder.add_source(Source("tensor", dtypes.float32, shape, values=values, requires_grad=True))


def smooth_unary(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    method = draw(st.sampled_from(SMOOTH_UNARY))
    if method in builder.excluded:
        return
    values = _values(builder, target)
    if values.size and method in POSITIVE_ONLY and values.min() < POSITIVE_ONLY[method]:
        return
    if values.size and method in AWAY_FROM_ZERO and np.abs(values).min() < 1e-2:
        return
    if values.size and method == "exp" and values.max() > 4:
        return
    builder.add_call(Call(target, method))


def arithmetic(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    method = draw(st.sampled_from(ARITHMETIC))
    if method in builder.excluded:
        return
    values = _values(builder, target)
    if method == "__pow__":
        exponent = draw(st.sampled_from([2, 3, 0.5, 1.5]))
        if isinstance(exponent, float) and (not values.size or values.min() < 0.2):
            return
        builder.add_call(Call(target, method, (exponent,)))
        return
    kind = draw(st.sampled_from(["source", "existing", "scalar"]))
    if kind == "scalar":
        operand: Any = draw(st.sampled_from([2.0, -0.5, 1.5, 3.0]))
    elif kind == "existing":
        shape = builder.values[target].shape
        candidates = [index for index, value in enumerate(builder.values)
                      if value is not None and value.dtype.is_float and broadcastable(value.shape, shape)]
        operand = Ref(draw(st.sampled_from(candidates[::-1])))
    else:
        operand = Ref(draw(grad_source(builder, draw(broadcast_shape(builder.values[target].shape)))))
    other = _values(builder, operand.index) if isinstance(operand, Ref) else np.float64(operand)
    with np.errstate(all="ignore"):
        if method == "__truediv__" and np.size(other) and np.abs(other).min() < 0.2:
            return
        if method in ("maximum", "minimum") and np.size(values) and np.size(other) and (
                np.abs(np.broadcast_arrays(values, other)[0] - np.broadcast_arrays(values, other)[1]).min() < 1e-2):
            return
    builder.add_call(Call(target, method, (operand,)))


def reduction(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    value = builder.values[target]
    rank = value.ndim
    if rank == 0:
        return
    method = draw(st.sampled_from(REDUCTIONS))
    if method in builder.excluded:
        return
    axis = draw(st.integers(-rank, rank - 1))
    values = _values(builder, target)
    keepdim = draw(st.booleans())
    if method in ("softmax", "log_softmax", "cumsum"):
        builder.add_call(Call(target, method, (axis,)))
        return
    if method in ("amax", "amin") and not _unique_extremes(values, axis % rank, method == "amax"):
        return
    if method == "var" and value.shape[axis] < 2:
        return
    if method == "prod" and (not values.size or np.abs(values).min() < 0.1 or value.shape[axis] > 6):
        return
    if method == "logsumexp":
        builder.add_call(Call(target, method, (axis,), (("keepdim", keepdim),)))
        return
    builder.add_call(Call(target, method, (axis,), (("keepdim", keepdim),)))


def _unique_extremes(values: np.ndarray, axis: int, largest: bool) -> bool:
    """The extreme along axis is at least 1e-2 away from the runner-up (no ties for the gradient to split)."""
    if values.shape[axis] < 2 or values.size == 0:
        return values.size > 0
    ordered = np.sort(values if largest else -values, axis=axis)
    first = np.take(ordered, -1, axis=axis)
    second = np.take(ordered, -2, axis=axis)
    return bool(np.all(first - second > 1e-2))


def movement(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    value = builder.values[target]
    rank = value.ndim
    method = draw(st.sampled_from(MOVEMENT))
    if method == "reshape":
        reshape(draw, builder, target)
    elif method == "permute":
        builder.add_call(Call(target, "permute", (tuple(draw(st.permutations(range(rank)))),)))
    elif method == "expand":
        new = [draw(st.sampled_from([1, 2, 3])) if size == 1 else size for size in value.shape]
        lead = [draw(st.sampled_from([2, 1]))] * draw(st.integers(0, 1))
        builder.add_call(Call(target, "expand", (tuple(lead + new),)))
    elif method == "pad" and rank:
        pad(draw, builder, target)
    elif method == "getitem" and rank:
        getitem(draw, builder, target)
    elif method == "flip" and rank:
        axes = sorted(set(draw(st.lists(st.integers(0, rank - 1), min_size=1))))
        builder.add_call(Call(target, "flip", (tuple(axes),)))
    elif method == "transpose" and rank:
        builder.add_call(Call(target, "transpose", (draw(st.integers(0, rank - 1)), draw(st.integers(0, rank - 1)))))
    elif method == "unsqueeze":
        builder.add_call(Call(target, "unsqueeze", (draw(st.integers(-rank - 1, rank)),)))
    elif method == "flatten" and rank:
        builder.add_call(Call(target, "flatten"))
    elif method == "narrow" and rank and value.shape[0]:
        start = draw(st.integers(0, value.shape[0] - 1))
        builder.add_call(Call(target, "narrow", (0, start, draw(st.integers(1, value.shape[0] - start)))))


def matmul(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    value = builder.values[target]
    if value.ndim == 0:
        return
    other = draw(grad_source(builder, matmul_operand_shape(draw, value.shape, draw(st.sampled_from([3, 2])))))
    builder.add_call(Call(target, "__matmul__", (Ref(other),)))


def select(draw: st.DrawFn, builder: ProgramBuilder, target: int) -> None:
    """where(condition, value, other value): the gradient goes to the chosen branch only."""
    shape = builder.values[target].shape
    condition_shape = draw(broadcast_shape(shape))
    condition = builder.add_source(Source("tensor", dtypes.bool_, condition_shape,
                                          values=draw(hnp.arrays(np.bool_, condition_shape))))
    # the other value broadcasts with the condition too, not only with the target
    other = draw(grad_source(builder, draw(broadcast_shape(broadcast_shapes(shape, condition_shape)))))
    builder.add_call(Call(target, "where", (Ref(condition), Ref(other))))


KINDS: dict[str, Callable[[st.DrawFn, ProgramBuilder, int], None]] = {
    "unary": smooth_unary, "arithmetic": arithmetic, "movement": movement, "reduction": reduction,
    "matmul": matmul, "where": select,
}


@st.composite
def differentiable_programs(draw: st.DrawFn, max_calls: int = 6, exclude: frozenset[str] = frozenset()) -> Program:
    """A random program of differentiable ops on float32 inputs that require gradients (methods in `exclude` never)."""
    builder = ProgramBuilder((dtypes.float32,))
    builder.excluded = exclude
    draw(grad_source(builder, draw(shapes(max_rank=4, max_elements=24))))
    for _ in range(draw(st.integers(1, max_calls))):
        if builder.stopped:
            break
        kind = draw(st.sampled_from(list(KINDS)))
        target = builder.pick(draw)
        if builder.values[target] is None or not builder.values[target].dtype.is_float:
            continue
        KINDS[kind](draw, builder, target)
    last = len(builder.values) - 1
    builder.program.outputs = (last,)
    return builder.program


# ---- running the program with ember and with torch --------------------------------------------------------------


def loss_weights(shape: tuple[int, ...], position: int) -> np.ndarray:
    """The fixed weights an output is multiplied by before summing into the loss."""
    return np.cos(np.arange(int(np.prod(shape))) + position).reshape(shape)


class TorchMaker:
    """Sources as float64 torch tensors (the gradient reference)."""

    def tensor(self, values: np.ndarray, dtype: DType, requires_grad: bool = False) -> Any:
        import torch

        as_float = dtype.is_float
        return torch.tensor(values, dtype=torch.float64 if as_float else torch.bool, requires_grad=requires_grad)

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> Any:
        import torch

        return torch.full(shape, value, dtype=torch.float64)

    def arange(self, count: int, dtype: DType) -> Any:
        import torch

        return torch.arange(count, dtype=torch.float64)


def torch_adapters() -> dict[str, Callable[..., Any]]:
    """ember methods that torch spells differently."""
    import torch

    functional = torch.nn.functional

    def as_tensor(like: Any, value: Any) -> Any:
        return value if torch.is_tensor(value) else torch.tensor(value, dtype=like.dtype)

    return {
        "pad": lambda tensor, amounts, value=0: functional.pad(tensor, amounts, value=value),
        "silu": functional.silu, "gelu": functional.gelu, "softplus": functional.softplus,
        "maximum": lambda tensor, other: torch.maximum(tensor, as_tensor(tensor, other)),
        "minimum": lambda tensor, other: torch.minimum(tensor, as_tensor(tensor, other)),
    }


def gradients(program: Program, maker: Any, adapters: dict[str, Callable[..., Any]] | None = None
              ) -> tuple[float, list[np.ndarray]]:
    """The loss and the gradient of every input that requires one."""
    values = program.run(maker, adapters)
    loss = None
    for position, index in enumerate(program.outputs):
        output = values[index]
        weights = loss_weights(tuple(output.shape), position)
        term = (output * maker.tensor(weights, dtypes.float32)).sum()
        loss = term if loss is None else loss + term
    assert loss is not None, "a program has at least one output"
    loss.backward()
    found = []
    for index in _gradient_inputs(program):
        tensor = values[index]
        grad = tensor.grad
        found.append(np.zeros(tuple(tensor.shape)) if grad is None else grad.detach().numpy().astype(np.float64))
    return float(loss.item()), found


def _gradient_inputs(program: Program) -> list[int]:
    return [index for index, node in enumerate(program.nodes) if isinstance(node, Source) and node.requires_grad]


def check_gradients(program: Program, device: str) -> None:
    """Compare ember's gradients on `device` with torch's (float64); raise FuzzMismatch with the code if they differ."""
    program = program.pruned()
    expected_loss, expected = gradients(program, TorchMaker(), torch_adapters())
    try:
        loss, actual = gradients(program, EmberMaker(device))
    except Exception as error:  # noqa: BLE001 - any error of ember on a valid program is a finding
        raise FuzzMismatch(_report(program, device, f"ember raised {type(error).__name__}: {error}")) from error
    scale = max(1.0, abs(expected_loss))
    same = loss == expected_loss or (math.isnan(loss) and math.isnan(expected_loss))
    if not (same or abs(loss - expected_loss) <= RELATIVE_TOLERANCE * scale):
        raise FuzzMismatch(_report(program, device, f"loss {loss!r} != torch {expected_loss!r}"))
    for position, (mine, theirs) in enumerate(zip(actual, expected)):
        if mine.shape != theirs.shape:
            raise FuzzMismatch(_report(program, device, f"gradient {position}: shape {mine.shape} != {theirs.shape}"))
        finite = np.isfinite(theirs)
        largest = max(1.0, float(np.abs(theirs[finite]).max(initial=0)))
        limit = np.where(finite, RELATIVE_TOLERANCE * np.abs(theirs) + ABSOLUTE_TOLERANCE * largest, 0.0)
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(mine - theirs) <= limit) & ~(np.isnan(mine) & np.isnan(theirs)) & ~(mine == theirs)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise FuzzMismatch(_report(program, device, (
                f"gradient of input {position} differs in {int(bad.sum())} of {bad.size} elements: at {where} "
                f"ember {mine[where]!r} torch {theirs[where]!r}")))


def _report(program: Program, device: str, problem: str) -> str:
    return f"{problem}\n--- program (paste to reproduce) ---\n{gradient_code(program, device)}\n"


def gradient_code(program: Program, device: str) -> str:
    """The program as ember code that computes the loss and prints each input's gradient."""
    lines = program.code(device).splitlines()
    lines = [line for line in lines if not line.startswith(("em.realize(", "print("))]
    terms = []
    for position, index in enumerate(program.outputs):
        terms.append(f"(t{index} * em.tensor(np.cos(np.arange(t{index}.numel()) + {position}).reshape(t{index}.shape)"
                     f".astype(np.float32), device={device!r})).sum()")
    lines.append("loss = " + " + ".join(terms))
    lines.append("loss.backward()")
    lines.extend(f"print(t{index}.grad.numpy())" for index in _gradient_inputs(program))
    return "\n".join(lines)


def gradient_fuzz_test(device: str, stats: FuzzStats, max_examples: int, derandomize: bool = False,
                       max_calls: int = 6, exclude: frozenset[str] = frozenset(),
                       deadline: float | None = None, budget: Budget | None = None) -> Callable[[], None]:
    """A Hypothesis test comparing the gradients of random programs on `device` with torch's (`budget`, or
    `deadline`, bounds its time as in fuzz.fuzz_test)."""
    budget = budget if budget is not None else Budget(deadline)

    @settings(max_examples=max_examples, deadline=None, derandomize=derandomize, database=None, print_blob=False,
              phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False, verbosity=Verbosity.quiet,
              suppress_health_check=list(HealthCheck))
    @given(differentiable_programs(max_calls=max_calls, exclude=exclude))
    def test(program: Program) -> None:
        if not budget.allows():
            return
        stats.examples += 1
        stats.gradient_examples += 1
        with CurrentProgram.running(lambda: gradient_code(program, device)), budget.recording():
            check_gradients(program, device)
        stats.passed += 1

    return test
