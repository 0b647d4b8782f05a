"""Fuzz programs: tensor sources and Tensor-method calls that run on ember or the reference and print as code."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ember.core import dtype as dtypes
from ember.core.dtype import DType


@dataclass(frozen=True)
class Ref:
    """An argument that is an earlier value of the program."""

    index: int


@dataclass(frozen=True)
class SeededValues:
    """Seeded random float32 values uniform in [offset, offset + scale), rounded down to integers if `integral`.

    The values of a large source: they print as the numpy expression that makes them (`code`), not as a literal."""

    seed: int
    scale: float
    offset: float
    integral: bool = False

    def array(self, shape: tuple[int, ...]) -> np.ndarray:
        """The values: the same as `code` computes (float32 arithmetic, done in place to save memory)."""
        values = np.random.default_rng(self.seed).random(shape, dtype=np.float32)
        values *= np.float32(self.scale)
        values += np.float32(self.offset)
        return np.floor(values, out=values) if self.integral else values

    def code(self, shape: tuple[int, ...]) -> str:
        expression = (f"np.random.default_rng({self.seed}).random({shape!r}, dtype=np.float32) * "
                      f"np.float32({self.scale!r}) + np.float32({self.offset!r})")
        return f"np.floor({expression})" if self.integral else expression


@dataclass(frozen=True)
class Source:
    """A tensor made from data (`tensor`), a constant (`full`), a range (`arange`) or seeded values (`random`)."""

    kind: str
    dtype: DType
    shape: tuple[int, ...]
    values: Any = None  # a numpy array for `tensor` (float32 holding bfloat16 values)
    fill: Any = None  # the value of a `full`, the SeededValues of a `random`
    requires_grad: bool = False  # a `tensor` whose gradient is checked


@dataclass(frozen=True)
class Call:
    """`values[target].method(*args, **kwargs)`; Ref arguments name other values."""

    target: int
    method: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


Node = Source | Call


class TensorMaker(Protocol):
    """How a program's sources become tensors of one implementation (ember on a device, or the reference)."""

    def tensor(self, values: np.ndarray, dtype: DType, requires_grad: bool = False) -> Any: ...

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> Any: ...

    def arange(self, count: int, dtype: DType) -> Any: ...


@dataclass
class Program:
    """Sources and calls in order (value i is node i) and the values that are outputs."""

    nodes: list[Node] = field(default_factory=list)
    outputs: tuple[int, ...] = ()
    large: bool = False  # one op over large inputs, checked against float64 truth (ember/testing/large.py)

    def run(self, maker: TensorMaker, adapters: dict[str, Callable[..., Any]] | None = None) -> list[Any]:
        """Every value of the program, made with `maker`; `adapters` replace methods by name (for other libraries)."""
        values: list[Any] = []
        for node in self.nodes:
            values.append(run_node(node, values, maker, adapters))
        return values

    def needed(self) -> list[int]:
        """The nodes the outputs depend on, in order."""
        keep: set[int] = set()
        pending = list(self.outputs)
        while pending:
            index = pending.pop()
            if index in keep:
                continue
            keep.add(index)
            node = self.nodes[index]
            if isinstance(node, Call):
                pending.append(node.target)
                pending.extend(ref.index for ref in references(node))
        return sorted(keep)

    def pruned(self) -> Program:
        """The same program without the nodes no output needs (indices renumbered)."""
        keep = self.needed()
        renumber = {old: new for new, old in enumerate(keep)}
        nodes = [renumbered(self.nodes[index], renumber) for index in keep]
        return Program(nodes, tuple(renumber[index] for index in self.outputs), self.large)

    def code(self, device: str) -> str:
        """The program as ember code a person can paste (only what the outputs need)."""
        program = self.pruned()
        lines = ["import numpy as np", "import ember as em", ""]
        for index, node in enumerate(program.nodes):
            lines.append(f"t{index} = {node_code(node, device)}")
        names = ", ".join(f"t{index}" for index in program.outputs)
        lines.append(f"em.realize({names})")
        for index in program.outputs:
            lines.append(f"print(t{index}.numpy())")
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.nodes)


def references(call: Call) -> list[Ref]:
    """The values a call uses besides its target (Refs in its arguments, also inside lists and tuples)."""
    found: list[Ref] = []

    def collect(value: Any) -> None:
        if isinstance(value, Ref):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)

    collect(call.args)
    collect([value for _, value in call.kwargs])
    return found


def _mapped(value: Any, function: Callable[[Ref], Any]) -> Any:
    """value with every Ref in it (also inside lists and tuples) replaced by function(ref)."""
    if isinstance(value, Ref):
        return function(value)
    if isinstance(value, list):
        return [_mapped(item, function) for item in value]
    if isinstance(value, tuple):
        return tuple(_mapped(item, function) for item in value)
    return value


def renumbered(node: Node, renumber: dict[int, int]) -> Node:
    if isinstance(node, Source):
        return node

    def fix(value: Any) -> Any:
        return _mapped(value, lambda ref: Ref(renumber[ref.index]))

    return Call(
        renumber[node.target], node.method, tuple(fix(value) for value in node.args),
        tuple((key, fix(value)) for key, value in node.kwargs),
    )


def run_node(node: Node, values: Sequence[Any], maker: TensorMaker,
             adapters: dict[str, Callable[..., Any]] | None = None) -> Any:
    """Evaluate one node given the values before it."""
    if isinstance(node, Source):
        if node.kind == "tensor":
            return maker.tensor(node.values, node.dtype, node.requires_grad) if node.requires_grad else (
                maker.tensor(node.values, node.dtype))
        if node.kind == "full":
            return maker.full(node.shape, node.fill, node.dtype)
        if node.kind == "random":
            return maker.tensor(node.fill.array(node.shape), node.dtype)
        return maker.arange(node.shape[0], node.dtype)

    def resolve(value: Any) -> Any:
        return _mapped(value, lambda ref: values[ref.index])

    arguments = [resolve(value) for value in node.args]
    keywords = {key: resolve(value) for key, value in node.kwargs}
    if adapters and node.method in adapters:
        return adapters[node.method](values[node.target], *arguments, **keywords)
    return getattr(values[node.target], node.method)(*arguments, **keywords)


# ---- printing -----------------------------------------------------------------------------------------------------

OPERATORS = {
    "__add__": "+", "__sub__": "-", "__mul__": "*", "__truediv__": "/", "__floordiv__": "//", "__mod__": "%",
    "__pow__": "**", "__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">=", "__eq__": "==", "__ne__": "!=",
    "__and__": "&", "__or__": "|", "__xor__": "^", "__lshift__": "<<", "__rshift__": ">>", "__matmul__": "@",
}
REFLECTED = {"__radd__": "+", "__rsub__": "-", "__rmul__": "*", "__rtruediv__": "/", "__rpow__": "**"}
PREFIX = {"__neg__": "-", "__invert__": "~", "__abs__": "abs"}


def node_code(node: Node, device: str) -> str:
    if isinstance(node, Source):
        where = f"dtype=em.{node.dtype.name}, device={device!r}"
        if node.kind == "tensor":
            grad = ", requires_grad=True" if node.requires_grad else ""
            return f"em.tensor({array_code(node.values, node.dtype)}, {where}{grad})"
        if node.kind == "full":
            return f"em.full({node.shape!r}, {value_code(node.fill)}, {where})"
        if node.kind == "random":
            return f"em.tensor({node.fill.code(node.shape)}, {where})"
        return f"em.arange({node.shape[0]}, {where})"
    target = f"t{node.target}"
    args = [value_code(value) for value in node.args]
    if node.method in OPERATORS and len(node.args) == 1 and not node.kwargs:
        return f"{target} {OPERATORS[node.method]} {args[0]}"
    if node.method in REFLECTED and len(node.args) == 1:
        return f"{args[0]} {REFLECTED[node.method]} {target}"
    if node.method in PREFIX and not node.args:
        symbol = PREFIX[node.method]
        return f"{symbol}({target})" if symbol.isalpha() else f"{symbol}{target}"
    if node.method == "__getitem__":
        return f"{target}[{index_code(node.args[0])}]"
    arguments = args + [f"{key}={value_code(value)}" for key, value in node.kwargs]
    return f"{target}.{node.method}({', '.join(arguments)})"


def value_code(value: Any) -> str:
    if isinstance(value, Ref):
        return f"t{value.index}"
    if isinstance(value, DType):
        return f"em.{value.name}"
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "-float('inf')"
        return repr(value)
    if isinstance(value, tuple):
        inner = ", ".join(value_code(item) for item in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(value_code(item) for item in value) + "]"
    return repr(value)


def index_code(index: Any) -> str:
    parts = index if isinstance(index, tuple) else (index,)
    shown = []
    for part in parts:
        if isinstance(part, slice):
            text = ("" if part.start is None else str(part.start)) + ":" + ("" if part.stop is None else str(part.stop))
            shown.append(text + ("" if part.step is None else f":{part.step}"))
        elif part is None:
            shown.append("None")
        elif part is Ellipsis:
            shown.append("...")
        else:
            shown.append(repr(part))
    if len(parts) == 1 and isinstance(index, tuple):
        return shown[0] + ","
    return ", ".join(shown) if shown else "()"


def array_code(values: np.ndarray, dtype: DType) -> str:
    """A numpy literal for the values of a source (np.nan and np.inf spelled out)."""
    numpy_name = "float32" if dtype == dtypes.bfloat16 else ("bool_" if dtype.is_bool else dtype.numpy.name)
    array = np.asarray(values)
    literal = f"np.array({_nested(array.tolist())}, dtype=np.{numpy_name})"
    return literal + (f".reshape({array.shape!r})" if array.size == 0 else "")


def _nested(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_nested(item) for item in value) + "]"
    if isinstance(value, float):
        if math.isnan(value):
            return "np.nan"
        if math.isinf(value):
            return "np.inf" if value > 0 else "-np.inf"
    return repr(value)
