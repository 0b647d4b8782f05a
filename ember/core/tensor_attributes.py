"""Tensor attributes torch code reads: `data`, `get_device`, `sum_to_size`, and the complex-number views of a real
tensor (ember has no complex dtypes, so conj, adjoint, H and mH are the identity or a transpose, imag an error)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ember.core.errors import DTypeError, ShapeError
from ember.core.tensor_base import TensorBase

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


class TensorAttributeOps(TensorBase):
    """Mixin: data, get_device, dim_order, new_empty_strided, sum_to_size, resize_, resize_as_, and the complex
    views (conj, resolve_conj, resolve_neg, conj_physical, is_conj, is_neg, real, imag, adjoint, H, mH)."""

    __slots__ = ()

    @property
    def data(self) -> Tensor:
        """The values without gradient history (torch's .data): in-place ops on it (`p.data.mul_(0.9)`) change this
        tensor's values without recording them; assigning `x.data = y` replaces x's values, keeping its
        requires_grad and history, as in torch."""
        from ember.core.tensor import Tensor
        from ember.core.views import link_view

        # an alias of the same storage whose writes do not count in its version (as torch's .data)
        return link_view(cast("Tensor", self), Tensor._from_node(self.node), shares_version=False)

    @data.setter
    def data(self, value: Tensor) -> None:
        from ember.core.views import set_value

        if not hasattr(value, "node"):
            raise TypeError(f"data: expected a Tensor to assign, got {type(value).__name__}")
        set_value(cast("Tensor", self), value.node)

    def get_device(self) -> int:
        """-1 for a tensor on the CPU (the c backend), else the index of its device (torch.Tensor.get_device)."""
        backend, _, index = self.device.partition(":")
        return -1 if backend == "c" else int(index or 0)

    def dim_order(self, *, ambiguity_check: Any = False) -> tuple[int, ...]:
        """The dims from outermost to innermost in memory: row-major for every ember tensor."""
        return tuple(range(self.ndim))

    def new_empty_strided(self, size: Any, stride: Any, *, dtype: Any = None, device: Any = None,
                          requires_grad: bool = False) -> Tensor:
        """new_empty of `size` (ember's tensors are row-major values: the strides are accepted, not kept)."""
        from ember.core.creation import empty_strided

        return empty_strided(size, stride, dtype=dtype or self.dtype, device=device or self.device,
                             requires_grad=requires_grad)

    def sum_to_size(self, *size: Any) -> Tensor:
        """Sum the dims self was broadcast along so that its shape becomes `size` (which must expand to self's)."""
        target = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
        if len(target) > self.ndim or any(
                wanted not in (1, actual) for wanted, actual in zip(target[::-1], self.shape[::-1])):
            raise ShapeError(f"sum_to_size: size {list(target)} is not expandable to the tensor's size "
                             f"{list(self.shape)}")
        leading = self.ndim - len(target)
        dims = tuple(range(leading)) + tuple(
            leading + index for index, wanted in enumerate(target) if wanted == 1 and self.shape[leading + index] != 1)
        result = self.sum(dims, keepdim=True) if dims else self
        return result.reshape(target)

    def resize_(self, *sizes: Any, memory_format: Any = None) -> Tensor:
        """Give this tensor the shape `sizes`, keeping its first elements in row-major order; elements beyond the old
        ones are zeros (torch leaves them uninitialized). A tensor that requires grad cannot be resized."""
        from ember.core.errors import AutogradError

        shape = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else tuple(sizes)
        if any(not isinstance(size, int) or size < 0 for size in shape):
            raise ShapeError(f"resize_: sizes must be non-negative ints, got {shape}")
        if self.requires_grad:
            raise AutogradError("cannot resize variables that require grad")
        count = 1
        for size in shape:
            count *= size
        flat = self.reshape(-1)
        kept = flat.narrow(0, 0, min(count, flat.shape[0]))
        if count > flat.shape[0]:
            kept = kept._pad_and_shrink([(0, count - flat.shape[0])], 0)
        return self._assign_view(kept.reshape(shape))

    def resize_as_(self, other: Tensor, memory_format: Any = None) -> Tensor:
        return self.resize_(tuple(other.shape))

    # ---- complex views of a real tensor ---------------------------------------------------------------------------

    def conj(self) -> Tensor:
        """self: the conjugate of a real tensor."""
        return cast("Tensor", self)

    def resolve_conj(self) -> Tensor:
        return cast("Tensor", self)

    def resolve_neg(self) -> Tensor:
        return cast("Tensor", self)

    def conj_physical(self) -> Tensor:
        """A copy of self (torch's conj_physical materializes the conjugate)."""
        return self.clone()

    def is_conj(self) -> bool:
        return False

    def is_neg(self) -> bool:
        return False

    @property
    def real(self) -> Tensor:
        return cast("Tensor", self)

    @property
    def imag(self) -> Tensor:
        raise DTypeError(f"imag is not implemented for tensors with non-complex dtypes (got {self.dtype.name}); "
                         f"ember has no complex dtypes")

    def adjoint(self) -> Tensor:
        """The conjugate transpose of the last two dims (their transpose, for real tensors)."""
        return _matrix_transpose(cast("Tensor", self), "tensor.adjoint()")

    @property
    def mH(self) -> Tensor:  # noqa: N802 - torch's name
        return _matrix_transpose(cast("Tensor", self), "tensor.mH")

    @property
    def H(self) -> Tensor:  # noqa: N802 - torch's name
        """The conjugate transpose of a matrix (2-d); a 0-d tensor is returned as it is."""
        if self.ndim == 0:
            return cast("Tensor", self)
        if self.ndim != 2:
            raise ShapeError(f"tensor.H is only supported on matrices (2-D tensors), got a {self.ndim}-D tensor; "
                             f"for batches of matrices use tensor.mH")
        return self.transpose(0, 1)


def _matrix_transpose(tensor: Tensor, op: str) -> Tensor:
    if tensor.ndim < 2:
        raise ShapeError(f"{op} is only supported on matrices or batches of matrices, got a {tensor.ndim}-D tensor")
    return tensor.transpose(-2, -1)


def real(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """torch.real: the real part, the tensor itself for ember's real dtypes."""
    return input.real


def imag(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
    """torch.imag: an error for real tensors, as in torch."""
    return input.imag
