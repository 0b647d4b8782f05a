"""check_against: run an ember model on saved reference inputs and compare its outputs (and, with per-layer
references, each layer's output) with another framework's, at a tolerance; the report names the first layer that
diverges."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.testing.pairs import CheckError, ReferencePair, first_tensor, flatten_result, load_pairs

DEFAULT_RTOL = 1e-3  # a float32 model over several layers accumulates more rounding than one op (torch's 1.3e-6)
DEFAULT_ATOL = 1e-4


@dataclass
class Comparison:
    """One output or layer of one pair against its reference: errors, and whether every element is within
    atol + rtol * |reference| (non-finite values must match exactly: NaN with NaN, inf with the same inf)."""

    pair: int
    name: str
    shape: tuple[int, ...]
    max_abs: float  # the largest |ember - reference| over elements finite in both (NaN when not compared)
    max_rel: float  # the largest |ember - reference| / |reference| over elements whose reference is not 0
    mismatched: int  # elements beyond the tolerance or with a non-finite value the reference does not have
    total: int
    passed: bool
    note: str = ""  # why it was not compared (a shape or dtype-kind mismatch)


@dataclass
class CheckReport:
    """What check_against found: a Comparison per output of each pair and per compared layer, and the first layer
    (in ember's execution order) that diverges. `passed` is True when every output and every compared layer is
    within the tolerance; str(report) is a table."""

    device: str
    rtol: float
    atol: float
    outputs: list[Comparison] = field(default_factory=list)
    layers: dict[int, list[Comparison]] = field(default_factory=dict)  # per pair, in ember's execution order
    reference_only_layers: dict[int, list[str]] = field(default_factory=dict)  # recorded, but ember ran no such one
    ember_only_layers: dict[int, list[str]] = field(default_factory=dict)  # ember ran them, no reference recorded
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.outputs) and all(
            row.passed for rows in self.layers.values() for row in rows if not row.note)

    def first_divergence(self, pair: int | None = None) -> Comparison | None:
        """The first layer, in execution order, beyond the tolerance (of `pair`, else of the first pair with one)."""
        for index in sorted(self.layers) if pair is None else [pair]:
            for row in self.layers.get(index, []):
                if not row.passed and not row.note:
                    return row
        return None

    def __str__(self) -> str:
        pairs = len({row.pair for row in self.outputs})
        lines = [f"ember check on {self.device}: {pairs} pair(s), rtol {self.rtol:g}, atol {self.atol:g}: "
                 + ("PASSED" if self.passed else "FAILED")]
        header = ("pair", "output", "shape", "max abs err", "max rel err", "out of tolerance", "result")
        rows = [header] + [(str(row.pair), row.name, str(row.shape), _number(row.max_abs), _number(row.max_rel),
                            f"{row.mismatched}/{row.total}", _verdict(row)) for row in self.outputs]
        widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
        lines.extend("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)
        for pair in sorted(self.layers):
            compared = [row for row in self.layers[pair] if not row.note]
            first = self.first_divergence(pair)
            line = f"layers of pair {pair}: {len(compared)} compared in execution order; "
            if first is None:
                line += "all within tolerance"
            else:
                line += (f"first diverging: {first.name} {first.shape} (max abs err {_number(first.max_abs)}, max rel "
                         f"err {_number(first.max_rel)}, {first.mismatched}/{first.total} out of tolerance)")
                earlier = compared[:compared.index(first)]
                if earlier:
                    line += f"; the layer before it, {earlier[-1].name}, is within tolerance"
            lines.append(line)
            skipped = [f"{row.name} ({row.note})" for row in self.layers[pair] if row.note]
            for title, names in (("not compared", skipped),
                                 ("recorded but not run by the ember model", self.reference_only_layers.get(pair, [])),
                                 ("run by the ember model without a reference", self.ember_only_layers.get(pair, []))):
                if names:
                    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
                    lines.append(f"  {title}: {shown}")
        lines.extend(self.notes)
        return "\n".join(lines)


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}"


def _verdict(row: Comparison) -> str:
    return row.note if row.note else ("pass" if row.passed else "FAIL")


def compare(pair: int, name: str, actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> Comparison:
    """One Comparison of ember's values with the reference's (numpy.allclose's rule, NaN equal to NaN)."""
    expected_shape = tuple(int(size) for size in expected.shape)
    if tuple(actual.shape) != expected_shape:
        return Comparison(pair, name, tuple(actual.shape), math.nan, math.nan, expected.size, expected.size, False,
                          f"shape {tuple(actual.shape)}, reference {expected_shape}")
    if (actual.dtype == np.bool_) != (expected.dtype == np.bool_):
        return Comparison(pair, name, expected_shape, math.nan, math.nan, expected.size, expected.size, False,
                          f"dtype {actual.dtype}, reference {expected.dtype}")
    ours, theirs = actual.astype(np.float64), expected.astype(np.float64)
    finite = np.isfinite(ours) & np.isfinite(theirs)
    both_nan = np.isnan(ours) & np.isnan(theirs)
    same_infinity = np.isinf(ours) & (ours == theirs)
    difference = np.zeros_like(ours)
    np.subtract(ours, theirs, out=difference, where=finite)
    np.abs(difference, out=difference)
    within = finite & (difference <= atol + rtol * np.abs(theirs)) | both_nan | same_infinity
    nonzero = finite & (theirs != 0)
    relative = np.divide(difference, np.abs(theirs), where=nonzero, out=np.zeros_like(ours))
    mismatched = int(expected.size - np.count_nonzero(within))
    return Comparison(pair, name, expected_shape, float(difference.max(initial=0.0)),
                      float(relative.max(initial=0.0)), mismatched, int(expected.size), mismatched == 0)


def _to_ember(array: np.ndarray, bfloat16: bool, device: str) -> Any:
    import ember as em

    value = em.tensor(array, device=device)
    return value.cast(em.bfloat16) if bfloat16 else value


def _numpy(value: Any) -> np.ndarray:
    from ember.core.tensor import Tensor

    if isinstance(value, Tensor):
        return np.asarray(value.float().numpy() if value.dtype.name == "bfloat16" else value.numpy())
    return np.asarray(value)


def _move_module(module: Any, device: str) -> None:
    if any(parameter.device != device for parameter in module.parameters()) or any(
            buffer.device != device for buffer in module.buffers()):
        module.to(device)


def _run_pair(fn: Callable[..., Any], module: Any, pair: ReferencePair, device: str,
              ) -> tuple[dict[str, np.ndarray], list[tuple[str, np.ndarray]]]:
    """Ember's outputs of one pair by name, and (with per-layer references and a module) each layer's value in
    execution order."""
    import ember as em
    from ember.core.tensor import Tensor, realize

    from ember.core.errors import EmberError

    try:
        args = [_to_ember(array, str(position) in pair.bfloat16, device) for position, array in enumerate(pair.args)]
        kwargs = {name: _to_ember(array, name in pair.bfloat16, device) for name, array in pair.kwargs.items()}
    except (EmberError, TypeError, ValueError) as error:
        raise CheckError(f"pair {pair.index}: an input cannot become an ember tensor on {device}: {error}") from None
    recorded: list[tuple[str, Any]] = []
    counts: dict[str, int] = {}
    handles = []
    if pair.layers and module is not None:
        def hook_for(name: str) -> Callable[..., None]:
            def hook(_: Any, __: Any, output: Any) -> None:
                value = first_tensor(output)
                if isinstance(value, Tensor):
                    count = counts.get(name, 0)
                    counts[name] = count + 1
                    recorded.append((name if count == 0 else f"{name}@{count}", value))

            return hook

        handles = [submodule.register_forward_hook(hook_for(name)) for name, submodule in module.named_modules()
                   if name]
    try:
        with em.no_grad():
            result = fn(*args, **kwargs)
            outputs = flatten_result(result)
            realize(*[value for value in outputs.values() if isinstance(value, Tensor)],
                    *[value for _, value in recorded])
    except CheckError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of the model on the inputs is reported as such
        shapes = ", ".join([f"{list(array.shape)} {array.dtype}" for array in pair.args]
                           + [f"{name}={list(array.shape)} {array.dtype}" for name, array in pair.kwargs.items()])
        raise CheckError(f"pair {pair.index}: the model raised {type(error).__name__} on the inputs ({shapes}): "
                         f"{error}") from error
    finally:
        for handle in handles:
            handle.remove()
    return ({name: _numpy(value) for name, value in outputs.items()},
            [(name, _numpy(value)) for name, value in recorded])


def check_against(fn: Callable[..., Any], pairs: str | os.PathLike[str] | Mapping[str, Any]
                  | Sequence[Mapping[str, Any]], *, device: Any = None, rtol: float = DEFAULT_RTOL,
                  atol: float = DEFAULT_ATOL, module: Any = None) -> CheckReport:
    """Run `fn` (an ember nn.Module or a function of ember tensors) on each reference pair's inputs on `device` and
    compare its outputs with the pair's reference outputs; returns a CheckReport (`.passed`, `print(report)`).

    pairs: a safetensors or .npz file, a flat dict, or a list of flat dicts, in ember.testing.pairs' layout
    (`pair<k>/input.0`, `pair<k>/output.0`, `pair<k>/layer.<module name>`, ...) as `record_reference` writes it.
    Inputs become ember tensors of their dtype on `device` (default: the default device); an nn.Module's parameters
    move there first. Outputs are matched by name: a tensor result is output 0, a tuple's items 0, 1, ..., a dict's
    values their keys. An element passes when |ember - reference| <= atol + rtol * |reference|.
    With per-layer references, forward hooks on `module` (default: `fn` itself when it is an nn.Module) record
    every submodule's output, and the report names the first layer in execution order that diverges.
    Raises CheckError for references that cannot be checked (a missing or corrupt file, a key outside the layout, an
    output the model does not return, a model that raises on the inputs).
    """
    from ember.core.errors import EmberError
    from ember.nn.module import Module
    from ember.scheduler.devices import resolve_device

    if not callable(fn):
        raise CheckError(f"check_against: fn must be callable (an ember nn.Module or a function), got "
                         f"{type(fn).__name__}")
    if not (rtol >= 0 and atol >= 0):
        raise CheckError(f"check_against: rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    try:
        device_name = resolve_device(device)
    except EmberError as error:
        raise CheckError(f"check_against: unknown or unavailable device {device!r}: {error}") from None
    loaded = load_pairs(pairs)
    if module is None and isinstance(fn, Module):
        module = fn
    if module is not None and not isinstance(module, Module):
        raise CheckError(f"check_against: module must be an ember nn.Module, got {type(module).__name__}")
    if module is not None:
        _move_module(module, device_name)
    report = CheckReport(device_name, rtol, atol)
    if any(pair.layers for pair in loaded) and module is None:
        report.notes.append("per-layer references were not compared: fn is not an ember nn.Module (pass module=)")
    for pair in loaded:
        outputs, layers = _run_pair(fn, module, pair, device_name)
        missing = [name for name in pair.outputs if name not in outputs]
        if missing:
            raise CheckError(f"pair {pair.index}: the reference has output(s) {', '.join(missing)} but the model "
                             f"returned {', '.join(outputs) or 'nothing'} (a tensor result is output 0; pick outputs "
                             "when recording, e.g. record_reference(..., outputs=lambda result: result[0]))")
        for name, expected in pair.outputs.items():
            report.outputs.append(compare(pair.index, name, outputs[name], expected, rtol, atol))
        extra = [name for name in outputs if name not in pair.outputs]
        if extra:
            report.notes.append(f"pair {pair.index}: outputs without a reference (not compared): {', '.join(extra)}")
        if pair.layers and module is not None:
            ran = {name for name, _ in layers}
            report.layers[pair.index] = [compare(pair.index, name, value, pair.layers[name], rtol, atol)
                                         for name, value in layers if name in pair.layers]
            report.reference_only_layers[pair.index] = [name for name in pair.layers if name not in ran]
            report.ember_only_layers[pair.index] = [name for name, _ in layers if name not in pair.layers]
    return report
