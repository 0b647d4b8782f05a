"""The lazy Tensor: records primitive ops as graph nodes; realizing and reading go through core's runtime interface."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, cast

import numpy as np

from ember.core import dtype as dtypes
from ember.context import CONTEXT
from ember.core import runtime
from ember.core.aliases import numpy_argument_names
from ember.core.arithmetic_forms import ArithmeticFormOps
from ember.core.convolution import ConvolutionOps
from ember.core.distances import DistanceOps
from ember.core.dtype import DType
from ember.core.elementwise import ElementwiseOps
from ember.core.errors import AutogradError, DTypeError, ShapeError
from ember.core.folding import FoldingOps
from ember.core.functional import FunctionalOps
from ember.core.graph import Node, infer
from ember.core.graph_templates import TEMPLATES, TracedFunction, function_signature
from ember.core.in_place import in_place_variants
from ember.core.indexing import IndexingOps
from ember.core.linalg import LinalgOps
from ember.core.losses import LossOps
from ember.core.margin_losses import MarginLossOps
from ember.core.movement import MovementOps
from ember.core.number_ops import NumberOps
from ember.core.ops import Composite, Op
from ember.core.random import RandomOps
from ember.core.reductions import ReductionOps
from ember.core.searching import SearchingOps
from ember.core.shapes import Shape, prod
from ember.core.sorting import SortingOps
from ember.core.stacking import StackingOps
from ember.core.tensor_attributes import TensorAttributeOps
from ember.core.torch_types import Size, device_object
from ember.core.views import Alias, detach_alias, rebind_view, view_methods, write_through


# compositions recorded for autograd whose value is a composition of their inputs' primitives decided by shapes,
# dtypes and the plain values of their compute function alone (elementwise functions, softmax, convolution and max
# pooling by their geometry): their graphs are copied from a template (core/graph_templates.py), not built op by op
TEMPLATED = frozenset({Composite.EXP, Composite.TANH, Composite.SIGMOID, Composite.RELU, Composite.SOFTMAX,
                       Composite.LOG_SOFTMAX, Composite.GELU, Composite.CONVOLUTION, Composite.MAX_POOL,
                       Composite.TRACED})
_new_tuple = tuple.__new__  # a Size from a node's shape without Size()'s checks (the shape is ints already)
_next_sequence = itertools.count().__next__  # creation order: a tensor's history only holds older tensors


@view_methods
@numpy_argument_names
@in_place_variants
class Tensor(ElementwiseOps, ReductionOps, MovementOps, IndexingOps, LinalgOps, FunctionalOps, ConvolutionOps, LossOps,
             SortingOps, SearchingOps, FoldingOps, StackingOps, ArithmeticFormOps, NumberOps, DistanceOps,
             MarginLossOps, TensorAttributeOps, RandomOps):
    """A lazy n-dimensional array with PyTorch's API. Nothing runs until a value is needed."""

    __slots__ = ("__weakref__", "_alias", "_context", "_hooks", "_post_accumulate_hooks", "_previous", "_requires_grad",
                 "_retains_grad", "_saved_versions", "_sequence", "_version", "grad", "node")
    __array_priority__ = 1000  # numpy defers to Tensor's reflected operators
    is_sharded = False  # a sharded kind (ShardedTensor) takes over the ops it is an operand of: _apply_as_operand
    _apply_as_operand: Callable[[Op, tuple[Any, ...], Any], Any]  # defined by the sharded kinds only

    def __init__(self, *arguments: Any, dtype: DType | str | None = None, device: str | None = None,
                 requires_grad: bool = False) -> None:
        """Tensor(data, dtype, device, requires_grad) (ember.tensor's meaning), or without a dtype torch's legacy
        forms: Tensor(3, 4) (zeros), Tensor(size), Tensor([1, 2]) (float32), Tensor() (core/legacy_constructor.py)."""
        from ember.core.legacy_constructor import constructor_node

        self.node: Node
        self.grad: Tensor | None
        self._context: tuple[Op | Composite, Any, tuple[Tensor, ...]] | None
        self._hooks: list[Callable[[Tensor], Tensor | None]] | None
        self._post_accumulate_hooks: list[Callable[[Tensor], None]] | None
        self._alias: Alias | None  # the storage this tensor shares with its views (core/views.py), if any
        self._saved_versions: tuple[int, ...] | None  # the versions of the _context's sources when it was recorded
        self._previous: Tensor | None  # this tensor as it was before its last recorded in-place change
        node, requires_grad = constructor_node(arguments, dtype, device, requires_grad)
        self._initialize(node)
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _from_node(cls, node: Node, requires_grad: bool = False) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._initialize(node, requires_grad)
        return tensor

    def _initialize(self, node: Node, requires_grad: bool = False) -> None:
        """Set every slot: a leaf holding `node` (subclasses such as nn.Parameter call this from __init__)."""
        self.node = node
        self._requires_grad = requires_grad
        self.grad = None
        self._context = None
        self._hooks = None
        self._post_accumulate_hooks = None
        self._retains_grad = False
        self._sequence = _next_sequence()
        self._alias = None
        self._version = 0  # in-place changes so far (torch's version counter; a storage's is shared by its views)
        self._saved_versions = None
        self._previous = None

    # ---- the primitive interface the op mixins are written against --------------------------------------------

    def _apply(self, op: Op, *others: Tensor, arg: Any = None) -> Tensor:
        """Record one primitive op on self and others (shapes and dtypes already checked), with its sources as they
        are: where it runs, and the copies that bring sources from other devices, are the scheduler's decision."""
        if others:
            for other in others:
                if other.is_sharded:  # an operand of a sharded kind runs the op itself (on its shards)
                    return other._apply_as_operand(op, (self, *others), arg)
            # (a binary op without the comprehension's frame: the per-op path)
            nodes = (self.node, others[0].node) if len(others) == 1 else (self.node, *[other.node for other in others])
        else:
            nodes = (self.node,)
        shape, result_dtype = infer(op, nodes, arg)
        output = Tensor._from_node(Node(op, nodes, arg, shape, result_dtype))
        # record the history backward needs; comparisons, integer and bool results never carry a gradient
        if result_dtype.is_float:
            tracked = self._requires_grad
            for other in others:
                tracked = tracked or other._requires_grad
            if tracked and CONTEXT.get().grad_enabled:  # (grad mode is per thread: ember/context.py)
                output._requires_grad = True
                output._context = (op, arg, (self, *others))
                output._saved_versions = (self._version, *[other._version for other in others])
        return output

    def _recorded(self, composite: Composite, compute: Callable[..., Tensor], sources: tuple[Tensor, ...],
                  arg: Any = None, held: tuple[Tensor, ...] = ()) -> Tensor:
        """compute(*sources, *held) (run without recording), recorded for autograd as one `composite` step of
        `sources` whose rule in autograd/rules.py gives torch's gradient formula, also where the primitives' chain
        rule would not. `held` are tensors compute reads that are no sources (a normalization's saved statistics,
        which its arg holds): with them the graph is copied from a template named by compute alone."""
        context = CONTEXT.get()
        signature: Hashable | None = None
        if composite is Composite.TRACED:  # (the arg names the function)
            signature = (composite, arg)
        elif held or composite in TEMPLATED:  # (the graph is copied from its template)
            computes = function_signature(compute)
            if computes is not None:
                signature = (composite, computes) if held else (composite, arg, computes)
        inputs = sources + held if held else sources
        if not context.grad_enabled or not any(source._requires_grad for source in sources):
            return compute(*inputs) if signature is None else TEMPLATES.instantiate(signature, compute, inputs)
        token = CONTEXT.set(context.with_grad(False))
        try:
            result = compute(*inputs) if signature is None else TEMPLATES.instantiate(signature, compute, inputs)
        finally:
            CONTEXT.reset(token)
        if not result.dtype.is_float:
            return result
        output = Tensor._from_node(result.node)  # a new tensor even when compute returned a source unchanged
        output._requires_grad = True
        output._context = (composite, arg, sources)
        output._saved_versions = tuple(source._version for source in sources)
        return output

    def _traced(self, compute: Callable[..., Tensor], sources: tuple[Tensor, ...]) -> Tensor:
        """compute(*sources), a pure composition of primitive ops on them (shapes and dtypes checked by the caller),
        as one step for autograd whose graph, and whose gradients' graph, are copied from templates
        (Composite.TRACED); recorded op by op where the function has no signature (it closes over a tensor)."""
        signature = function_signature(compute)
        if signature is None:
            return compute(*sources)
        return self._recorded(Composite.TRACED, compute, sources, TracedFunction(signature, compute))

    def _checked(self, invalid: Tensor, describe: Any, named: Tensor | None) -> Tensor:
        """self as a new node carrying a check (core/checks.py): its violation is computed lazily from `invalid`."""
        from ember.core.checks import Check, attach, first_invalid_position, fresh_node

        token = CONTEXT.set(CONTEXT.get().with_grad(False))
        try:  # (a copy of its template from the second check of a shape on: a dozen ops at every lazy check)
            violation = TEMPLATES.instantiate(("first invalid position",), first_invalid_position, (invalid,))
        finally:
            CONTEXT.reset(token)
        output = fresh_node(self)
        attach(output.node, Check(violation.node, None if named is None else named.node, describe))
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
    def shape(self) -> Size:
        """The extents, as an ember.Size (torch.Size: a tuple with numel()); the node keeps a plain tuple."""
        return _new_tuple(Size, self.node.shape)

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def device(self) -> str:
        """Where the values live, or for a recorded op the device the scheduler's placement rule runs it on: an
        ember.device (torch.device, a str equal to the name, e.g. 'c:0', with .type 'c' and .index 0)."""
        device = self.node.device
        return device_object(device if device is not None else runtime.RUNTIME.device_of(self.node))

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    def dim(self) -> int:
        return len(self.node.shape)

    def size(self, dim: int | None = None) -> Size | int:
        from ember.core.shapes import normalize_dim

        shape = self.node.shape
        return _new_tuple(Size, shape) if dim is None else shape[normalize_dim(dim, len(shape), "size")]

    def numel(self) -> int:
        return prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    nelement = numel
    ndimension = dim

    def is_floating_point(self) -> bool:
        return self.dtype.is_float

    def is_complex(self) -> bool:
        return False  # ember has no complex dtypes

    def is_signed(self) -> bool:
        return not self.dtype.is_bool and not self.dtype.is_unsigned

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    @property
    def is_cpu(self) -> bool:
        """Whether this tensor is on the c device, where x.cpu() puts it."""
        return self.device.split(":")[0] == "c"

    def is_same_size(self, other: Tensor) -> bool:
        return self.shape == other.shape

    def is_nonzero(self) -> bool:
        """The truth of a one-element tensor (torch's is_nonzero; a RuntimeError for other sizes)."""
        if self.numel() != 1:
            raise ShapeError(f"is_nonzero(): a tensor with {self.numel()} elements has no single truth value; "
                             f"it needs exactly one element")
        return bool(self.item())

    def equal(self, other: Tensor) -> bool:
        """Whether other has the same shape and elements (torch.equal: NaN is not equal to NaN)."""
        if not isinstance(other, Tensor):
            raise TypeError(f"equal(): argument 'other' (position 1) must be Tensor, not {type(other).__name__}")
        return self.shape == other.shape and bool((self == other).all().item())

    # torch's layout queries: a view answers with torch's strides and offset into the storage it shares with its
    # base (core/views.py); any other tensor is row-major

    def stride(self, dim: int | None = None) -> tuple[int, ...] | int:
        """The element strides (row-major, or a view's torch strides into its base)."""
        from ember.core.shapes import normalize_dim, strides_of

        strides = strides_of(self.shape) if self._alias is None else self._alias.strides
        return strides if dim is None else strides[normalize_dim(dim, self.ndim, "stride")]

    def storage_offset(self) -> int:
        return 0 if self._alias is None else self._alias.offset

    def is_contiguous(self, memory_format: Any = None) -> bool:
        """Whether the strides are row-major (dims of size 1 do not count, as in torch)."""
        from ember.core.shapes import strides_of

        if self._alias is None:
            return True
        return all(size == 1 or stride == expected
                   for size, stride, expected in zip(self.shape, self._alias.strides, strides_of(self.shape)))

    @property
    def _base(self) -> Tensor | None:
        """The tensor this one is a view of (torch's _base), None for a tensor that is not a view."""
        base = None if self._alias is None else self._alias.base
        return None if base is None else base()

    def _is_view(self) -> bool:
        return self._base is not None

    def type_as(self, other: Tensor) -> Tensor:
        """self cast to other's dtype."""
        if not isinstance(other, Tensor):
            raise TypeError(f"type_as(): argument 'other' (position 1) must be Tensor, not {type(other).__name__}")
        return self.cast(other.dtype)

    def ravel(self) -> Tensor:
        return self.reshape(-1)

    # ---- torch's new_* constructors: the dtype and device of self unless given ------------------------------

    def new_tensor(self, data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """A new leaf holding a copy of data, in self's dtype and on self's device unless given."""
        if isinstance(data, Tensor):
            data = data._detached_copy()
        return Tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_full(self, size: Sequence[int], fill_value: Any, *, dtype: Any = None, device: Any = None,
                 requires_grad: bool = False) -> Tensor:
        from ember.core.creation import full

        if not isinstance(size, (tuple, list)):
            raise TypeError(
                f"new_full(): argument 'size' (position 1) must be tuple of ints, not {type(size).__name__}"
            )
        return full(size, fill_value, dtype or self.dtype, device or self.device, requires_grad)

    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        from ember.core.creation import zeros

        return zeros(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        from ember.core.creation import ones

        return ones(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_empty(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        from ember.core.creation import empty

        return empty(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    # ---- in-place copies and random fills ------------------------------------------------------------------

    def copy_(self, src: Tensor, non_blocking: bool = False) -> Tensor:
        """Overwrite self with src broadcast to self's shape, cast to its dtype, moved to its device."""
        if not isinstance(src, Tensor):
            raise TypeError(f"copy_(): argument 'src' (position 1) must be Tensor, not {type(src).__name__}")
        return self.assign(src)

    # ---- autograd -------------------------------------------------------------------------------------------

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    @property
    def is_leaf(self) -> bool:
        """True for tensors made by the user (not by an op recorded for autograd), as in torch."""
        return self._context is None

    @property
    def grad_fn(self) -> Any:
        """None for a leaf, else the backward function of the primitive op that made this tensor."""
        from ember.autograd.engine import BackwardFunction

        return None if self._context is None else BackwardFunction(self)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Make this leaf record the ops applied to it, so backward() gives it a .grad."""
        if requires_grad and not self.dtype.is_float:
            raise DTypeError(
                f"only floating point tensors can require gradients, got a {self.dtype.name} tensor of shape "
                f"{self.shape}; cast it first, e.g. .float()"
            )
        if not requires_grad and self._context is not None:
            raise AutogradError(
                f"requires_grad_(False): the tensor of shape {self.shape} is not a leaf (it was computed from "
                "tensors that require grad); use .detach() to get a tensor without history"
            )
        self._requires_grad = bool(requires_grad)
        return self

    def detach(self) -> Tensor:
        """The same values without a gradient history, sharing this tensor's storage and version counter as in
        torch: an in-place change of either changes both (core/views.py)."""
        return detach_alias(self)

    def _detached_copy(self) -> Tensor:
        """This tensor's current value without history as a tensor of its own, at no cost (it shares the graph
        node, which never changes: an in-place change gives a tensor a new node). Later in-place changes of either
        do not reach the other, as with detach().clone(); ember's own code uses it for values it reads or keeps."""
        return Tensor._from_node(self.node)

    def detach_(self) -> Tensor:
        """Drop this tensor's history in place: it becomes a leaf that does not require grad."""
        self._context = None
        self._requires_grad = False
        return self

    def retain_grad(self) -> None:
        """Let backward() fill .grad of this non-leaf too (leaves always get one)."""
        if not self._requires_grad:
            raise AutogradError(f"retain_grad: the tensor of shape {self.shape} does not require grad")
        if self._context is not None:
            self._retains_grad = True

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def register_hook(self, hook: Callable[[Tensor], Tensor | None]) -> Any:
        """Call hook(gradient) when this tensor's gradient is computed; a returned tensor replaces the gradient."""
        if not self._requires_grad:
            raise AutogradError(f"register_hook: the tensor of shape {self.shape} does not require grad")
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)
        return _HookHandle(self._hooks, hook)

    def register_post_accumulate_grad_hook(self, hook: Callable[[Tensor], None]) -> Any:
        """Call hook(tensor) after backward() has accumulated this leaf's .grad (and computed it), as in torch."""
        if self._context is not None:
            raise AutogradError(f"register_post_accumulate_grad_hook: the tensor of shape {self.shape} is not a leaf; "
                                "post accumulate grad hooks can be registered on leaf tensors only")
        if not self._requires_grad:
            raise AutogradError(f"register_post_accumulate_grad_hook: the tensor of shape {self.shape} does not "
                                "require grad, so backward() never accumulates a .grad into it")
        if self._post_accumulate_hooks is None:
            self._post_accumulate_hooks = []
        self._post_accumulate_hooks.append(hook)
        return _HookHandle(self._post_accumulate_hooks, hook)

    def backward(
        self, gradient: Tensor | None = None, retain_graph: bool | None = None, create_graph: bool = False,
        inputs: Sequence[Tensor] | None = None,
    ) -> None:
        """Accumulate the gradient of this tensor into .grad of the leaves it was computed from."""
        from ember.autograd.engine import backward

        backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # ---- realization and conversion --------------------------------------------------------------------------

    def realize(self) -> Tensor:
        """Compute this tensor now (fusing, compiling and running its kernels); returns self."""
        runtime.RUNTIME.realize([self.node])
        return self

    def contiguous(self) -> Tensor:
        return self if self.node.realized else self._apply(Op.CONTIGUOUS)

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values (bfloat16 is returned as float32)."""
        self.realize()
        array = runtime.RUNTIME.read(self.node)
        if self.dtype == dtypes.bfloat16:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array.astype(dtype) if dtype is not None else array

    def item(self) -> bool | int | float:
        if self.numel() != 1:
            raise ShapeError(
                f"item(): only one-element tensors can be converted to Python scalars, got shape {self.shape}"
            )
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(
                f"the truth value of a tensor with {self.numel()} elements is ambiguous; use any() or all()"
            )
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

    def __format__(self, format_spec: str) -> str:
        """f"{x:.4f}": a 0-d tensor formats as its Python number; others only with an empty spec (as str(x)), as in
        torch (which raises the same TypeError for a spec on a tensor that is not 0-d)."""
        if not self.node.shape:
            return format(self.detach().item(), format_spec)
        if format_spec:
            raise TypeError(f"unsupported format string passed to Tensor.__format__: {format_spec!r} on a tensor of "
                            f"shape {self.shape}; a format spec applies to 0-d tensors only (format x.item() for a "
                            f"one-element tensor, or each value of x.tolist())")
        return str(self)

    def __hash__(self) -> int:
        return id(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> Tensor:
        """A leaf with the same values (graph nodes are immutable values, so it shares this one's node)."""
        from copy import deepcopy

        copied = type(self).__new__(type(self))
        copied._initialize(self.node, self._requires_grad)
        memo[id(self)] = copied
        if self.grad is not None:
            copied.grad = deepcopy(self.grad, memo)
        return copied

    def __reduce__(self) -> Any:
        raise TypeError("ember tensors cannot be pickled; save them with ember.save(obj, path) (safetensors) instead")

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
        if CONTEXT.get().grad_enabled and self._requires_grad:
            output._requires_grad = True
            output._context = (Op.COPY, device, (self,))
            output._saved_versions = (self._version,)
        return output

    def shard(self, devices: Sequence[str], dim: int = 0) -> Any:
        """Split this tensor along `dim` across `devices`; ops on the result run on every shard."""
        return runtime.RUNTIME.shard(self, devices, dim)

    def cpu(self, memory_format: Any = None) -> Tensor:
        """This tensor on ember's CPU device (the c backend), like torch's x.cpu()."""
        return self.to(runtime.RUNTIME.backend_device("c", None, "cpu()"))

    def cuda(self, device: Any = None, non_blocking: bool = False, memory_format: Any = None) -> Tensor:
        """This tensor on a cuda device (the first, or `device`: an index or 'cuda:N'), like torch's x.cuda()."""
        return self.to(runtime.RUNTIME.backend_device("cuda", device, "cuda()"))

    def clone(self) -> Tensor:
        return self._apply(Op.CONTIGUOUS)

    def assign(self, value: Tensor) -> Tensor:
        """Replace this tensor's value in place (shape and dtype are kept; used by in-place ops and optimizers)."""
        if value.shape != self.shape:
            value = value.expand(self.shape)
        if value.dtype != self.dtype:
            value = value.cast(self.dtype)
        if value.device != self.device:
            value = value.to(self.device)
        context = CONTEXT.get()
        if context.recorder is not None:  # (ember.jit realizes what a recorded call changed in place)
            context.recorder.assigned.append(weakref.ref(self))
        if self._alias is not None:  # a view, or a tensor with views: write into the storage they share
            return write_through(self, value)
        if context.grad_enabled and (self._requires_grad or value._requires_grad):
            self._assign_history(value)
        old, new = self.node, value.node
        if not new.realized and new.replaces is None:
            if old.buffer is not None and old.realized:
                new.replaces = old  # the scheduler may compute new into old's buffer when nothing else reads it
            elif old.replaces is not None:  # a second assign before a realize: new takes over the buffer's node
                new.replaces, old.replaces = old.replaces, None
        self.node = new
        self._version += 1
        return self

    def _assign_view(self, value: Tensor) -> Tensor:
        """Rebind this tensor to value, a view of it with another shape (torch's t_, squeeze_, transpose_, ...)."""
        if CONTEXT.get().grad_enabled and (self._requires_grad or value._requires_grad):
            self._assign_history(value)
        if self._alias is not None:
            rebind_view(self, value)
        self.node = value.node
        return self

    def _assign_history(self, value: Tensor) -> None:
        """Autograd for an in-place change: this tensor's history becomes value's (as torch rebases a grad_fn)."""
        if self._requires_grad and self._context is None:
            raise AutogradError(
                f"a leaf tensor of shape {self.shape} that requires grad cannot be changed in place while grad is "
                "recorded; do it inside `with em.no_grad():` (as optimizers do) or on a .detach()ed copy"
            )
        # value's history, and that of tensors made from this one before, refer to this tensor as it was before;
        # give that old state its own Tensor (backward finds it by the version it was saved at)
        if self._requires_grad:
            previous = snapshot(self)
            self._previous = previous
            _replace_source(value, self, previous)
        if not value._requires_grad or value._context is None:  # e.g. a non-leaf overwritten by a constant
            self._context = (Op.CONTIGUOUS, None, (value,))
            self._saved_versions = (value._version,)
        else:
            self._context = value._context
            self._saved_versions = value._saved_versions
        self._requires_grad = value._requires_grad or self._requires_grad
        self._sequence = _next_sequence()


def snapshot(tensor: Tensor) -> Tensor:
    """tensor as it is now (value, history, version), as a Tensor of its own: what histories recorded before an
    in-place change of tensor refer to (autograd/engine.py finds it by version)."""
    previous = Tensor._from_node(tensor.node, tensor._requires_grad)
    previous._context = tensor._context
    previous._saved_versions = tensor._saved_versions
    previous._version = tensor._version
    previous._previous = tensor._previous
    return previous


class _HookHandle:
    """Returned by register_hook: .remove() takes the hook off again."""

    def __init__(self, hooks: list[Any], hook: Any) -> None:
        self.hooks, self.hook = hooks, hook

    def remove(self) -> None:
        if self.hook in self.hooks:
            self.hooks.remove(self.hook)


def _replace_source(root: Tensor, old: Tensor, new: Tensor) -> None:
    """Rewrite the recorded history of root so that every use of `old` becomes `new`.

    Only tensors created after `old` can refer to it, so the walk stops at older ones.
    """
    visited: set[int] = set()
    pending = [root]
    while pending:
        tensor = pending.pop()
        if tensor._context is None or id(tensor) in visited:
            continue
        visited.add(id(tensor))
        op, arg, sources = tensor._context
        if any(source is old for source in sources):
            sources = tuple(new if source is old else source for source in sources)
            tensor._context = (op, arg, sources)
        pending.extend(source for source in sources if source._sequence > old._sequence)


def realize(*tensors: Tensor) -> None:
    """Compute several tensors at once, sharing one schedule (ember.realize(a, b, c))."""
    nodes: list[Node] = []
    for tensor in tensors:
        if tensor.is_sharded:  # a ShardedTensor (sharding/tensor.py): its shards' nodes
            nodes.extend(piece.node for piece in cast(Any, tensor).shards)
        else:
            nodes.append(tensor.node)
    if nodes:  # (a jit replay realizes its unrealized arguments: usually none)
        runtime.RUNTIME.realize(nodes)


def is_tensor(obj: Any) -> bool:
    """Whether obj is an ember Tensor (torch.is_tensor)."""
    return isinstance(obj, Tensor) or getattr(obj, "is_sharded", False) is True


def tensor_sequence(values: Sequence[Tensor]) -> list[Tensor]:
    """Check that a sequence holds Tensors, naming the first that is not."""
    result = list(values)
    for position, value in enumerate(result):
        if not isinstance(value, ElementwiseOps):  # the mixin: Tensor, its subclasses, and the reference tensor
            raise TypeError(f"expected a sequence of Tensors, element {position} is {type(value).__name__}")
    return result
