"""float16 and bfloat16 statistics computed in float32 and rounded to the half type once, as torch computes them.

A kernel already computes half values in float32 and rounds only what it stores, but a composite of several kernels
(a mean, then the squared deviations from it, then their mean) stores its intermediates: in float16 a sum of more
than 65,504 overflows to inf (the mean of 10^5 ones was inf, a layer norm over 10^5 values NaN), and a float16 mean
subtracted from values near 1,000 is off by up to 0.25. torch computes these in float32 ("opmath") and rounds the
result; `computed_in_float32` does the same for a method whose first argument is the tensor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ember.core import dtype as dtypes

HALF_TYPES = (dtypes.float16, dtypes.bfloat16)

Method = TypeVar("Method", bound=Callable[..., Any])


def computed_in_float32(method: Method) -> Method:
    """`method` run on float32 casts of its half-precision tensor (the first argument) and of the arguments of that
    same dtype (a weight, a bias, a second operand), its tensor results cast back to the half dtype. Methods that
    update a tensor argument in place (running statistics) must not use it: they would update the cast."""

    @functools.wraps(method)
    def run(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        half = getattr(tensor, "dtype", None)
        if half not in HALF_TYPES:
            return method(tensor, *args, **kwargs)
        result = method(widened(tensor, half), *(widened(arg, half) for arg in args),
                        **{name: widened(value, half) for name, value in kwargs.items()})
        return rounded(result, half)

    return run  # type: ignore[return-value]


def widened(value: Any, half: dtypes.DType) -> Any:
    """`value` cast to float32 where it is a tensor of the dtype `half`; anything else (None, a number, a tensor of
    another dtype) as it is."""
    return value.cast(dtypes.float32) if getattr(value, "dtype", None) is half else value


def rounded(result: Any, half: dtypes.DType) -> Any:
    """Float32 tensors of a result (one tensor, or a tuple of them such as a named tuple) cast to `half`."""
    if isinstance(result, tuple):
        values = [rounded(value, half) for value in result]
        return type(result)(*values) if hasattr(result, "_fields") else tuple(values)
    return result.cast(half) if getattr(result, "dtype", None) is dtypes.float32 else result
