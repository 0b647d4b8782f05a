"""The lazy Tensor: records primitive ops as graph nodes, realizes them through the scheduler, converts to numpy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.elementwise import ElementwiseOps
from ember.core.errors import DeviceError
from ember.core.functional import FunctionalOps
from ember.core.graph import Node, infer
from ember.core.indexing import IndexingOps
from ember.core.linalg import LinalgOps
from ember.core.movement import MovementOps
from ember.core.ops import Op
from ember.core.reductions import ReductionOps
from ember.core.shapes import Shape, prod


class GradMode:
    """Whether ops record what autograd needs (switched off by ember.no_grad)."""

    enabled: bool = True


class Tensor(ElementwiseOps, ReductionOps, MovementOps, IndexingOps, LinalgOps, FunctionalOps):
    """A lazy n-dimensional array with PyTorch's API. Nothing runs until a value is needed."""

    __slots__ = ("node", "requires_grad", "grad", "_context", "__weakref__")
    __array_priority__ = 1000  # numpy defers to Tensor's reflected operators

    def __init__(
        self,
        data: Any,
        dtype: DType | str | None = None,
        device: str | None = None,
        requires_grad: bool = False,
    ) -> None:
        from ember.core.creation import node_from_data

        self.node: Node = node_from_data(data, dtype, device)
        self.requires_grad = False
        self.grad: Tensor | None = None
        self._context: tuple[Op, Any, tuple[Tensor, ...]] | None = None
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _from_node(cls, node: Node, requires_grad: bool = False) -> Tensor:
        tensor = cls.__new__(cls)
        tensor.node = node
        tensor.requires_grad = requires_grad
        tensor.grad = None
        tensor._context = None
        return tensor

    # ---- the primitive interface the op mixins are written against --------------------------------------------

    def _apply(self, op: Op, *others: Tensor, arg: Any = None) -> Tensor:
        """Record one primitive op on self and others (same device, shapes and dtypes already checked)."""
        sources = (self, *others)
        for other in others:
            if other.node.device != self.node.device:
                raise DeviceError(
                    f"expected all tensors to be on the same device, but found {self.node.device} and "
                    f"{other.node.device}; move one with .to(device)"
                )
        nodes = tuple(source.node for source in sources)
        shape, result_dtype = infer(op, nodes, arg)
        output = Tensor._from_node(Node(op, nodes, arg, shape, result_dtype, self.node.device))
        if GradMode.enabled and any(source.requires_grad for source in sources):
            output.requires_grad = True
            output._context = (op, arg, sources)
        return output

    @classmethod
    def _full(cls, shape: Shape, value: Any, dtype: DType, device: str) -> Tensor:
        """A lazy constant of a shape (no memory until used)."""
        value = bool(value) if dtype.is_bool else int(value) if dtype.is_int else float(value)
        return cls._from_node(Node(Op.CONST, (), value, tuple(shape), dtype, device))

    @classmethod
    def _arange_primitive(cls, count: int, dtype: DType, device: str) -> Tensor:
        return cls._from_node(Node(Op.ARANGE, (), None, (count,), dtype, device))

    # ---- properties ------------------------------------------------------------------------------------------

    @property
    def shape(self) -> Shape:
        return self.node.shape

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def device(self) -> str:
        return self.node.device

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    def dim(self) -> int:
        return len(self.node.shape)

    def size(self, dim: int | None = None) -> Shape | int:
        from ember.core.shapes import normalize_dim

        return self.shape if dim is None else self.shape[normalize_dim(dim, self.ndim, "size")]

    def numel(self) -> int:
        return prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def is_leaf(self) -> bool:
        return self._context is None

    @property
    def grad_fn(self) -> Any:
        return None if self._context is None else self._context[0]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # ---- realization and conversion --------------------------------------------------------------------------

    def realize(self) -> Tensor:
        """Compute this tensor now (fusing, compiling and running its kernels); returns self."""
        from ember.scheduler.realize import realize_nodes

        realize_nodes([self.node])
        return self

    def contiguous(self) -> Tensor:
        return self if self.node.realized else self._apply(Op.CONTIGUOUS)

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values (bfloat16 is returned as float32)."""
        from ember.scheduler.realize import read_node

        self.realize()
        array = read_node(self.node)
        if self.dtype == dtypes.bfloat16:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array.astype(dtype) if dtype is not None else array

    def item(self) -> bool | int | float:
        if self.numel() != 1:
            raise ValueError(f"item(): only one-element tensors can be converted to Python scalars, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.numel()} elements is ambiguous; use any() or all()")
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        if self.dtype.is_float or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __repr__(self) -> str:
        from ember.core.printing import tensor_repr

        return tensor_repr(self)

    def __hash__(self) -> int:
        return id(self)

    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        """`to(dtype)`, `to(device)` or `to(device, dtype)`, like torch.Tensor.to."""
        from ember.core.creation import parse_to_arguments

        device, dtype = parse_to_arguments(args, kwargs)
        result = self
        if dtype is not None and dtype != result.dtype:
            result = result.cast(dtype)
        if device is not None and device != result.device:
            result = result._copy_to(device)
        return result

    def _copy_to(self, device: str) -> Tensor:
        output = Tensor._from_node(Node(Op.COPY, (self.node,), device, self.shape, self.dtype, device))
        if GradMode.enabled and self.requires_grad:
            output.requires_grad = True
            output._context = (Op.COPY, device, (self,))
        return output

    def cpu(self) -> Tensor:
        return self.to("c")

    def clone(self) -> Tensor:
        return self._apply(Op.CONTIGUOUS)

    def detach(self) -> Tensor:
        """The same values without a gradient history (shares the graph node, records nothing)."""
        return Tensor._from_node(self.node)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and not (self.dtype.is_float):
            raise RuntimeError(f"only tensors of floating point dtype can require gradients, got {self.dtype.name}")
        self.requires_grad = requires_grad
        return self

    def backward(self, gradient: Tensor | None = None, retain_graph: bool = False, create_graph: bool = False) -> None:
        from ember.autograd.engine import backward

        backward(self, gradient, create_graph=create_graph)

    def assign(self, value: Tensor) -> Tensor:
        """Replace this tensor's value in place (shape and dtype are kept; used by in-place ops and optimizers)."""
        if value.shape != self.shape:
            value = value.expand(self.shape)
        if value.dtype != self.dtype:
            value = value.cast(self.dtype)
        if value.device != self.device:
            value = value.to(self.device)
        self.node = value.node
        if not GradMode.enabled or not value.requires_grad:
            self._context = None if not self.requires_grad or not GradMode.enabled else value._context
        else:
            self._context = value._context
            self.requires_grad = True
        return self


def realize(*tensors: Tensor) -> None:
    """Compute several tensors at once, sharing one schedule (ember.realize(a, b, c))."""
    from ember.scheduler.realize import realize_nodes

    realize_nodes([tensor.node for tensor in tensors])


def tensor_sequence(values: Sequence[Tensor]) -> list[Tensor]:
    """Check that a sequence holds Tensors, naming the first that is not."""
    result = list(values)
    for position, value in enumerate(result):
        if not isinstance(value, Tensor):
            raise TypeError(f"expected a sequence of Tensors, element {position} is {type(value).__name__}")
    return result
