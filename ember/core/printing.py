"""How a tensor prints: PyTorch's repr (`tensor([[1., 2.], ...], dtype=ember.float16, device='opencl:0')`).

The rules are torch's: one width for every element; floats print as integers with a dot when all are whole,
in scientific notation when the nonzero magnitudes span more than 1000x or leave [1e-4, 1e8), else with 4
decimals; lines wrap at 80 columns; tensors of more than 1000 elements show 3 items at each edge of every dim.
set_printoptions changes these numbers as torch's does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ember.core import dtype as dtypes
from ember.core import runtime

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

PREFIX = "tensor("


class PrintOptions:
    """torch's print options (set_printoptions): decimals, the element count above which a print is summarized, the
    items shown at each edge when it is, the line width, and scientific notation (None: chosen from the values)."""

    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None


PROFILES: dict[str, dict[str, float]] = {
    "default": {"precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80},
    "short": {"precision": 2, "threshold": 1000, "edgeitems": 2, "linewidth": 80},
    "full": {"precision": 4, "threshold": math.inf, "edgeitems": 3, "linewidth": 80},
}


def set_printoptions(precision: int | None = None, threshold: float | None = None, edgeitems: int | None = None,
                     linewidth: int | None = None, profile: str | None = None, sci_mode: bool | None = None) -> None:
    """Set how tensors print, like torch.set_printoptions: a profile ('default', 'short', 'full') first, then each
    option given; sci_mode is always set (None lets the values choose, as in torch)."""
    if profile is not None:
        if profile not in PROFILES:
            raise ValueError(f"set_printoptions: unknown profile {profile!r}; valid: {', '.join(PROFILES)}")
        for name, profile_value in PROFILES[profile].items():
            setattr(PrintOptions, name, profile_value)
    for name, value in (("precision", precision), ("threshold", threshold), ("edgeitems", edgeitems),
                        ("linewidth", linewidth)):
        if value is not None:
            setattr(PrintOptions, name, value)
    PrintOptions.sci_mode = sci_mode


class _Formatter:
    """Formats every element of one tensor to a common width, choosing the float style from all the values."""

    def __init__(self, values: np.ndarray, floating: bool) -> None:
        self.floating = floating
        self.integer_mode = True
        self.scientific = False
        self.width = 1
        flat = values.reshape(-1)
        if not floating:
            for value in flat.tolist():
                self.width = max(self.width, len(str(value)))
            return
        finite = flat[np.isfinite(flat) & (flat != 0)].astype(np.float64)
        if finite.size == 0:
            return
        magnitude = np.abs(finite)
        smallest, largest = float(magnitude.min()), float(magnitude.max())
        self.integer_mode = bool(np.all(finite == np.ceil(finite)))
        spread = largest / smallest > 1000.0 or largest > 1.0e8
        if PrintOptions.sci_mode is not None:
            self.scientific = bool(PrintOptions.sci_mode)
        elif self.integer_mode:
            self.scientific = spread
        else:
            self.scientific = spread or smallest < 1.0e-4
        for value in finite.tolist():
            if self.scientific:
                text = f"{value:.{PrintOptions.precision}e}"
            elif self.integer_mode:
                text = f"{value:.0f}."
            else:
                text = f"{value:.{PrintOptions.precision}f}"
            self.width = max(self.width, len(text))

    def format(self, value: object) -> str:
        if not self.floating:
            text = str(value)
        elif self.scientific:
            text = f"{value:{self.width}.{PrintOptions.precision}e}"
        elif self.integer_mode:
            text = f"{value:.0f}" + ("" if math.isinf(value) or math.isnan(value) else ".")  # type: ignore[arg-type]
        else:
            text = f"{value:.{PrintOptions.precision}f}"
        return " " * (self.width - len(text)) + text


def _summarized(values: np.ndarray) -> np.ndarray:
    """The elements a summarized print shows: `edgeitems` at each end of every dim (for the formatter's widths)."""
    if values.ndim == 0:
        return values
    edge = PrintOptions.edgeitems
    if values.shape[0] > 2 * edge:
        values = np.concatenate([values[:edge], values[-edge:]])
    if values.ndim == 1:
        return values
    return np.stack([_summarized(row) for row in values])


def _vector(values: np.ndarray, indent: int, summarize: bool, formatter: _Formatter) -> str:
    per_line = max(1, (PrintOptions.linewidth - indent) // (formatter.width + 2))
    edge = PrintOptions.edgeitems
    if summarize and values.shape[0] > 2 * edge:
        items = [formatter.format(value) for value in values[:edge].tolist()] + [" ..."] + [
            formatter.format(value) for value in values[-edge:].tolist()
        ]
    else:
        items = [formatter.format(value) for value in values.tolist()]
    lines = [", ".join(items[start : start + per_line]) for start in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested(values: np.ndarray, indent: int, summarize: bool, formatter: _Formatter) -> str:
    if values.ndim == 0:
        return formatter.format(values.item())
    if values.ndim == 1:
        return _vector(values, indent, summarize, formatter)
    edge = PrintOptions.edgeitems
    if summarize and values.shape[0] > 2 * edge:
        rows = [_nested(values[index], indent + 1, summarize, formatter) for index in range(edge)] + ["..."] + [
            _nested(values[index], indent + 1, summarize, formatter)
            for index in range(values.shape[0] - edge, values.shape[0])
        ]
    else:
        rows = [_nested(row, indent + 1, summarize, formatter) for row in values]
    return "[" + ("," + "\n" * (values.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def _suffixes(tensor: Tensor, empty: bool) -> list[str]:
    suffixes = []
    if tensor.device != runtime.RUNTIME.default_device():
        suffixes.append(f"device='{tensor.device}'")
    if empty:
        if tensor.ndim != 1:
            suffixes.append(f"size={tuple(tensor.shape)}")
        if tensor.dtype is not dtypes.DEFAULT_FLOAT:
            suffixes.append(f"dtype={tensor.dtype!r}")
    elif tensor.dtype not in (dtypes.DEFAULT_FLOAT, dtypes.int64, dtypes.bool_):
        suffixes.append(f"dtype={tensor.dtype!r}")
    grad_fn = tensor.grad_fn
    if grad_fn is not None:
        suffixes.append(f"grad_fn=<{grad_fn.name()}>")
    elif tensor.requires_grad:
        suffixes.append("requires_grad=True")
    return suffixes


def tensor_repr(tensor: Tensor) -> str:
    """torch's repr of a tensor with ember's dtype names and device suffix (shown when not the default device)."""
    values = tensor._detached_copy().numpy()
    indent = len(PREFIX)
    empty = values.size == 0
    if empty:
        body = "[]"
    else:
        summarize = values.size > PrintOptions.threshold
        floating = tensor.dtype.is_float
        if floating:
            values = values.astype(np.float32) if tensor.dtype in (dtypes.float16, dtypes.bfloat16) else values
        formatter = _Formatter(_summarized(values) if summarize else values, floating)
        body = _nested(values, indent, summarize, formatter)
    text = PREFIX + body
    last_line_length = len(text) - text.rfind("\n") + 1
    parts = [text]
    for suffix in _suffixes(tensor, empty):
        if last_line_length + len(suffix) + 2 > PrintOptions.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            last_line_length = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line_length += len(suffix) + 2
    return "".join(parts) + ")"
