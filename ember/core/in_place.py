"""torch's in-place variants (`x.exp_()`, `x.clamp_min_(0)`, `x.t_()`), made by one rule, not written one at a time.

The rule: a tensor class gets `NAME_` for every `torch.Tensor.NAME_` in the committed list of torch's names whose
out-of-place `NAME` the class has and that it does not define itself. `NAME_(*args)` computes `NAME(*args)` and
rebinds the tensor to the result with torch's checks: the result dtype must cast to self's dtype (`x_int.sqrt_()`
is a RuntimeError, as in torch) and it may not broadcast self to a larger shape. The view ops in `VIEW_IN_PLACE`
change the tensor's shape instead (`x.t_()`). So an op added to a mixin later gets its in-place form here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ember.torch_names import TENSOR_METHODS

TensorClass = TypeVar("TensorClass", bound=type)

# in-place view ops: the result has another shape, which becomes self's (torch changes the view's metadata)
VIEW_IN_PLACE = frozenset({"squeeze_", "unsqueeze_", "t_", "transpose_", "swapaxes_", "swapdims_"})

# torch's NAME_ that is not "NAME, then write into self": float_power_ requires a float64 self (torch raises for
# any other dtype rather than casting the float64 result back)
NOT_IN_PLACE_FORMS = frozenset({"float_power_"})


def _in_place(base: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    if name in VIEW_IN_PLACE:

        def variant(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._assign_view(getattr(self, base)(*args, **kwargs))
    else:

        def variant(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._assign_in_place(getattr(self, base)(*args, **kwargs), name)

    variant.__name__ = variant.__qualname__ = name
    variant.__doc__ = f"In place: self becomes self.{base}(...)." + (f"\n\n{method.__doc__}" if method.__doc__ else "")
    try:
        variant.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    variant._numpy_argument_names = True  # type: ignore[attr-defined]  # the out-of-place method it calls takes them
    return variant


def in_place_variants(tensor_class: TensorClass) -> TensorClass:
    """Give tensor_class torch's in-place variant of each of its methods that torch has one of (see the module)."""
    for name in TENSOR_METHODS:
        if not name.endswith("_") or name.startswith("_") or name in NOT_IN_PLACE_FORMS:
            continue
        if inspect.getattr_static(tensor_class, name, None) is not None:
            continue
        base = name[:-1]
        method = inspect.getattr_static(tensor_class, base, None)
        if inspect.isfunction(method):
            setattr(tensor_class, name, _in_place(base, name, method))
    return tensor_class
