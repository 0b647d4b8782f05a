"""The forms `ember.Tensor(...)` takes: torch's legacy constructor (Tensor(3, 4), Tensor(size), Tensor([1, 2]),
Tensor()) and ember's own Tensor(data, dtype, device, requires_grad), told apart by their arguments."""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.torch_types import Size

_FORMS = ("Tensor(*sizes), Tensor(size: ember.Size), Tensor(data: a sequence, array or tensor), Tensor(), or "
          "Tensor(data, dtype, device, requires_grad)")


def _is_size(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def constructor_node(arguments: tuple[Any, ...], dtype: Any, device: Any, requires_grad: bool) -> tuple[Node, bool]:
    """The leaf node `Tensor(*arguments, dtype=..., device=..., requires_grad=...)` holds, and its requires_grad.

    With a dtype (positional after the data, or by keyword) the data keeps ember's meaning (as ember.tensor). Without
    one these are torch's legacy forms: ints are sizes (the values are zeros: torch leaves them uninitialized), an
    ember.Size is a size, other data (a sequence, numpy array) becomes the default float dtype, a tensor keeps its
    dtype, and Tensor() is an empty float tensor.
    """
    from ember.core.creation import _checked_shape, _device, node_from_data

    if len(arguments) >= 2 and (arguments[1] is None or isinstance(arguments[1], (DType, str))):  # ember's form
        if len(arguments) > 4:
            raise TypeError(f"Tensor() takes at most 4 positional arguments in the (data, dtype, device, "
                            f"requires_grad) form, got {len(arguments)}")
        data, dtype, *rest = arguments
        device = rest[0] if rest else device
        requires_grad = rest[1] if len(rest) > 1 else requires_grad
        return node_from_data(data, dtype, device), requires_grad
    if dtype is not None:
        if len(arguments) != 1:
            raise TypeError(f"Tensor(): with dtype= give one data argument (ember.tensor's meaning), got "
                            f"{len(arguments)} positional arguments; the forms are {_FORMS}")
        return node_from_data(arguments[0], dtype, device), requires_grad
    if all(_is_size(argument) for argument in arguments) or (len(arguments) == 1 and isinstance(arguments[0], Size)):
        sizes = tuple(int(extent) for extent in (arguments[0] if arguments and isinstance(arguments[0], Size)
                                                 else arguments))
        shape = _checked_shape(sizes, "Tensor") if sizes else (0,)
        return Node(Op.CONST, (), 0.0, shape, dtypes.DEFAULT_FLOAT, _device(device)), requires_grad
    if len(arguments) != 1:
        described = ", ".join(type(argument).__name__ for argument in arguments)
        raise TypeError(f"Tensor(): no form takes ({described}); the forms are {_FORMS}")
    data = arguments[0]
    if isinstance(data, (float, bool, complex, np.floating, np.bool_)):
        raise TypeError(f"Tensor(): data must be a sequence (got {type(data).__name__}); for a 0-d tensor use "
                        f"ember.tensor({data!r})")
    keeps_dtype = hasattr(data, "dtype") and hasattr(data, "detach")  # an ember or torch tensor keeps its dtype
    return node_from_data(data, None if keeps_dtype else dtypes.DEFAULT_FLOAT, device), requires_grad
