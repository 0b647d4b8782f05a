"""How a tensor prints: like torch (`tensor([[1., 2.], ...], dtype=..., device=...)`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ember.core import dtype as dtypes

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _format_floats(array: np.ndarray) -> dict:
    finite = array[np.isfinite(array)]
    if finite.size and np.all(finite == np.round(finite)) and np.abs(finite).max(initial=0) < 1e8:
        return {"formatter": {"float_kind": lambda value: _integer_float(value)}}
    magnitude = np.abs(finite[finite != 0]) if finite.size else finite
    if magnitude.size and (magnitude.max() >= 1e8 or magnitude.min() < 1e-4 or magnitude.max() / magnitude.min() > 1000):
        return {"formatter": {"float_kind": lambda value: f"{value:.4e}"}}
    return {"formatter": {"float_kind": lambda value: f"{value:.4f}"}}


def _integer_float(value: float) -> str:
    if np.isnan(value):
        return "nan"
    if np.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.0f}."


def tensor_repr(tensor: Tensor) -> str:
    array = tensor.numpy()
    options = _format_floats(array) if array.dtype.kind == "f" else {}
    if array.dtype == np.bool_:
        options = {"formatter": {"bool": lambda value: "True" if value else "False"}}
    body = np.array2string(array, separator=", ", prefix="tensor(", threshold=1000, edgeitems=3, **options)
    suffix = []
    if tensor.device.split(":")[0] != "c":
        suffix.append(f"device='{tensor.device}'")
    if tensor.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool_):
        suffix.append(f"dtype=ember.{tensor.dtype.name}")
    if tensor.requires_grad:
        suffix.append("requires_grad=True")
    if array.size == 0:
        body = "[]"
        suffix.insert(0, f"size={tensor.shape}")
    return "tensor(" + body + "".join(", " + item for item in suffix) + ")"
