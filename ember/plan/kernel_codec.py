"""Kernels, schedule items and graph signatures as JSON values and back (traces, plans, the test session's PTX check).

A dtype becomes its name (dtypes compare by identity, which a copy loses), an Op its name, a tuple a list, a float
that JSON cannot hold (inf, NaN) its `float.hex()` text; decoding gives back equal, hashable values, so a decoded
kernel is the same compile cache key as the one encoded."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from ember.core.dtype import DTYPES_BY_NAME, DType
from ember.core.graph_templates import Template, TemplateResult
from ember.core.ops import Op
from ember.ir.kernel import Kernel, KernelStep


class CodecError(ValueError):
    """A value that has no JSON form here, or JSON that is not an encoded value."""


def encode(value: Any) -> Any:
    """`value` (kernels, steps, tuples, ops, dtypes, numbers, strings, None) as a JSON value."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": value.hex()}
    if isinstance(value, DType):
        return {"dtype": value.name}
    if isinstance(value, Op):
        return {"op": value.name}
    if isinstance(value, TemplateResult):
        return {"template result": [encode(value.template), value.position]}
    if isinstance(value, KernelStep):
        return {"step": [encode(field) for field in value]}
    if isinstance(value, Kernel):
        encoded = [[encode(step) for step in value.steps], list(value.input_sizes)]
        return {"kernel": [*encoded, list(value.input_offsets)] if value.input_offsets else encoded}
    if isinstance(value, tuple):
        return [encode(item) for item in value]
    if isinstance(value, Template):  # (a TEMPLATE node's arg in a graph signature: its graph, which names it)
        return {"template": [encode(value.entries), encode(value.outputs), value.inputs]}
    raise CodecError(f"cannot encode a {type(value).__name__} ({value!r:.80}) as JSON")


def decode(value: Any) -> Any:
    """The value `encode` was given (tuples for lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return tuple(decode(item) for item in value)
    if isinstance(value, dict) and len(value) == 1:
        (tag, content), = value.items()
        try:
            if tag == "dtype":
                return DTYPES_BY_NAME[content]
            if tag == "op":
                return Op[content]
            if tag == "float":
                return float.fromhex(content)
            if tag == "step":
                return KernelStep(*(decode(field) for field in content))
            if tag == "kernel":
                steps, sizes, *offsets = content
                if len(offsets) > 1:
                    raise ValueError("more than steps, sizes and offsets")
                return Kernel(tuple(decode(step) for step in steps), tuple(sizes), tuple(offsets[0]) if offsets else ())
            if tag == "template result":
                template, position = content
                return TemplateResult(decode(template), int(position))
            if tag == "template":
                entries, outputs, inputs = content
                return Template(decode(entries), decode(outputs), int(inputs))
        except (KeyError, TypeError, ValueError) as error:
            raise CodecError(f"bad encoded {tag}: {content!r:.80} ({error})") from None
    raise CodecError(f"not an encoded value: {value!r:.80}")


def signature_digest(key: tuple) -> str:
    """A stable name of a graph signature (schedule.graph_key's key) across processes: the sha256 of its JSON."""
    text = json.dumps(encode(key), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
