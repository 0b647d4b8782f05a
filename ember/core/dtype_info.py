"""torch's dtype queries: finfo, iinfo, the default float dtype, result_type and can_cast."""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.core import dtype as dtypes
from ember.core.dtype import PYTHON_SCALARS, DType, combine_result_types, to_dtype

# decimal digits of precision torch reports as `resolution` (10 ** -floor(digits)); numpy has no bfloat16
_BFLOAT16 = {"bits": 16, "eps": 2.0**-7, "max": 3.3895313892515355e38, "tiny": 2.0**-126, "resolution": 0.01}


class finfo:  # noqa: N801 - torch's name
    """torch.finfo(dtype): the limits of a floating point dtype (the default dtype when none is given)."""

    def __init__(self, dtype: Any = None) -> None:
        resolved = dtypes.DEFAULT_FLOAT if dtype is None else to_dtype(dtype)
        if not resolved.is_float:
            raise TypeError(f"ember.finfo() requires a floating point dtype, got {resolved.name}; use ember.iinfo "
                            f"for integer dtypes")
        if resolved is dtypes.bfloat16:
            values = _BFLOAT16
        else:
            info = np.finfo(resolved.numpy)
            values = {"bits": int(info.bits), "eps": float(info.eps), "max": float(info.max),
                      "tiny": float(info.tiny), "resolution": 10.0 ** -int(info.precision)}
        self.bits: int = int(values["bits"])
        self.eps: float = values["eps"]
        self.max: float = values["max"]
        self.min: float = -values["max"]
        self.tiny: float = values["tiny"]
        self.smallest_normal: float = values["tiny"]
        self.resolution: float = values["resolution"]
        self.dtype: str = resolved.name

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.smallest_normal:g}, tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:  # noqa: N801 - torch's name
    """torch.iinfo(dtype): the limits of an integer dtype."""

    def __init__(self, dtype: Any) -> None:
        resolved = to_dtype(dtype)
        if resolved.is_bool:
            raise TypeError("ember.bool is not supported by ember.iinfo (as in torch)")
        if not resolved.is_int:
            raise TypeError(f"ember.iinfo() requires an integer dtype, got {resolved.name}; use ember.finfo for "
                            f"floating point dtypes")
        info = np.iinfo(resolved.numpy)
        self.bits: int = int(info.bits)
        self.max: int = int(info.max)
        self.min: int = int(info.min)
        self.dtype: str = resolved.name

    def __repr__(self) -> str:
        return f"iinfo(min={self.min:g}, max={self.max:g}, dtype={self.dtype})"


def get_default_dtype() -> DType:
    """The dtype of floats made without one (float32 unless set_default_dtype changed it)."""
    return dtypes.DEFAULT_FLOAT


def set_default_dtype(dtype: Any) -> None:
    """Make `dtype` (a floating point dtype) the default of tensors from Python floats, zeros/ones/rand/arange and
    of integer tensors promoted by a float (torch.set_default_dtype)."""
    resolved = to_dtype(dtype)
    if not resolved.is_float:
        raise TypeError(f"only floating-point types are supported as the default type, got {resolved.name}")
    dtypes.DEFAULT_FLOAT = resolved


def result_type(tensor: Any, other: Any) -> DType:
    """The dtype torch's type promotion gives an op on tensor and other (each a tensor or a Python number)."""
    from ember.core.elementwise import ElementwiseOps

    dimensioned: list[DType] = []
    zero_dim: list[DType] = []
    scalars: list[DType] = []
    for position, value in enumerate((tensor, other)):
        if isinstance(value, ElementwiseOps):
            (dimensioned if value.ndim else zero_dim).append(value.dtype)
        elif isinstance(value, PYTHON_SCALARS):
            scalars.append(dtypes.scalar_dtype(value))
        else:
            name = ("tensor", "other")[position]
            raise TypeError(f"result_type(): argument '{name}' (position {position + 1}) must be Tensor or Number, "
                            f"not {type(value).__name__}")
    return combine_result_types(dimensioned, zero_dim, scalars)



