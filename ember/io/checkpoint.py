"""ember.save / ember.load: torch.save's objects (tensors, state dicts, whole checkpoints) in one safetensors file.

No pickle: the tensors are the file's tensors, named by their path in the object ("model.fc.weight",
"optimizer.state.0.exp_avg"), and the structure around them (dicts with any scalar keys, lists, tuples, numbers,
strings, None, dtypes) is JSON in the header's `__metadata__` under "ember_structure". A saved state dict is
therefore an ordinary safetensors file that other tools read, and `ember.load` of a safetensors file written
elsewhere gives a dict of its tensors. A tensor that appears several times (tied weights) is stored once and loads
as one tensor object again.
"""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember.core import dtype as dtypes
from ember.core.tensor import Tensor
from ember.io.safetensors import SafetensorsError, load_safetensors, read_safetensors_header, save_safetensors

STRUCTURE_KEY = "ember_structure"
FORMAT_KEY = "ember_format"
FORMAT_VERSION = "1"
SUPPORTED = "ember Tensors, dicts, lists, tuples, str, int, float, bool, None and ember dtypes"


class _Encoder:
    """Walks an object once: JSON for its structure, and its tensors by unique name."""

    def __init__(self) -> None:
        self.tensors: dict[str, Tensor] = {}
        self.name_of: dict[int, str] = {}  # id(tensor) -> its name, so a shared tensor is stored once

    def encode(self, value: Any, path: list[Any]) -> Any:
        if isinstance(value, Tensor):
            return self._tensor(value, path)
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, np.generic) and value.dtype.kind in "biuf":  # numpy scalars are saved as numbers
            value = value.item()
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"float": repr(value)}
        if isinstance(value, dtypes.DType):
            return {"dtype": value.name}
        if isinstance(value, Mapping) and type(value) in (dict, OrderedDict):
            items = [[self._key(key, path), self.encode(item, path + [key])] for key, item in value.items()]
            return {"ordered_dict" if isinstance(value, OrderedDict) else "dict": items}
        if type(value) in (list, tuple):
            items = [self.encode(item, path + [index]) for index, item in enumerate(value)]
            return {type(value).__name__: items}
        hint = "; convert it with ember.tensor(...) first" if isinstance(value, np.ndarray) or hasattr(
            value, "__array__") else ""
        raise TypeError(
            f"ember.save: cannot save the {type(value).__module__}.{type(value).__qualname__} at {_where(path)}; "
            f"ember saves {SUPPORTED} (without pickle){hint}"
        )

    def _key(self, key: Any, path: list[Any]) -> Any:
        if key is None or isinstance(key, (bool, int, str)) or (isinstance(key, float) and math.isfinite(key)):
            return key
        raise TypeError(
            f"ember.save: the dict at {_where(path)} has a key of type {type(key).__name__} ({key!r}); dict keys "
            f"must be str, int, float, bool or None"
        )

    def _tensor(self, tensor: Tensor, path: list[Any]) -> dict[str, Any]:
        from ember.nn.parameter import Parameter

        name = self.name_of.get(id(tensor))
        if name is None:
            name = ".".join(str(part) for part in path) or "tensor"
            if name in self.tensors:  # two paths that spell the same name ("a.b" and ["a"]["b"])
                name = next(f"{name}#{count}" for count in range(1, len(self.tensors) + 2)
                            if f"{name}#{count}" not in self.tensors)
            self.tensors[name] = tensor._detached_copy()
            self.name_of[id(tensor)] = name
        kind = "parameter" if isinstance(tensor, Parameter) else "tensor"
        encoded: dict[str, Any] = {kind: name}
        if tensor.requires_grad:
            encoded["requires_grad"] = True
        return encoded


def _where(path: list[Any]) -> str:
    """Where a value sits in the saved object, as Python would index it: obj['optimizer']['state'][0]."""
    return "obj" + "".join(f"[{part!r}]" for part in path)


def save(obj: Any, f: str | os.PathLike[str]) -> None:
    """Save a tensor, a state dict or a nested checkpoint ({'model': ..., 'optimizer': ..., 'epoch': 3}) to the
    path f as safetensors, like torch.save (without pickle: objects other than tensors, containers, numbers,
    strings and dtypes raise a TypeError naming where they are)."""
    if not isinstance(f, (str, os.PathLike)):
        raise TypeError(f"ember.save: f must be a file path (str or os.PathLike), got {type(f).__name__}")
    encoder = _Encoder()
    structure = encoder.encode(obj, [])
    metadata = {FORMAT_KEY: FORMAT_VERSION, STRUCTURE_KEY: json.dumps(structure, allow_nan=False), "format": "pt"}
    save_safetensors(encoder.tensors, f, metadata=metadata)


def load(f: str | os.PathLike[str], map_location: Any = None, weights_only: bool | None = None, **_: Any) -> Any:
    """Load what ember.save wrote (or any safetensors file: then a dict of its tensors) onto map_location (the
    default device if None; "cpu" is ember's c device). weights_only is accepted for torch compatibility: loading
    never runs code."""
    if not isinstance(f, (str, os.PathLike)):
        raise TypeError(f"ember.load: f must be a file path (str or os.PathLike), got {type(f).__name__}")
    metadata = read_safetensors_header(f)[1]
    from ember.scheduler.devices import get_default_device

    # mapped from the file, copied to the device when first used (load_safetensors alone keeps disk tensors)
    tensors = load_safetensors(f, device=map_location if map_location is not None else get_default_device())
    if STRUCTURE_KEY not in metadata:
        return tensors
    try:
        structure = json.loads(metadata[STRUCTURE_KEY])
    except json.JSONDecodeError as error:
        raise SafetensorsError(f"{os.fspath(f)}: the ember structure in the metadata is not valid JSON ({error}); "
                               "the file is corrupt") from None
    return _Decoder(os.fspath(f), tensors).decode(structure, [])


class _Decoder:
    def __init__(self, file: str, tensors: dict[str, Tensor]) -> None:
        self.file, self.tensors = file, tensors
        self.loaded: dict[str, Tensor] = {}  # one object per stored tensor, however often it is referenced

    def decode(self, node: Any, path: list[Any]) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, dict) and len(node) in (1, 2):
            kind = next(iter(node))
            if kind in ("tensor", "parameter"):
                return self._tensor(node[kind], kind == "parameter", bool(node.get("requires_grad")), path)
            if len(node) == 1:
                value = node[kind]
                if kind == "float" and value in ("nan", "inf", "-inf"):
                    return float(value)
                if kind == "dtype" and value in dtypes.DTYPES_BY_NAME:
                    return dtypes.DTYPES_BY_NAME[value]
                if kind in ("list", "tuple") and isinstance(value, list):
                    items = [self.decode(item, path + [index]) for index, item in enumerate(value)]
                    return items if kind == "list" else tuple(items)
                if kind in ("dict", "ordered_dict") and isinstance(value, list) and all(
                    isinstance(item, list) and len(item) == 2 for item in value
                ):
                    pairs = ((key, self.decode(item, path + [key])) for key, item in value)
                    return OrderedDict(pairs) if kind == "ordered_dict" else dict(pairs)
        raise SafetensorsError(f"{self.file}: the ember structure has an invalid entry {node!r} at {_where(path)}; "
                               "the file is corrupt")

    def _tensor(self, name: Any, parameter: bool, requires_grad: bool, path: list[Any]) -> Tensor:
        if not isinstance(name, str) or name not in self.tensors:
            raise SafetensorsError(
                f"{self.file}: the ember structure refers to a tensor {name!r} at {_where(path)} that the file does "
                "not hold; the file is corrupt"
            )
        key = f"{name}/{parameter}/{requires_grad}"
        if key not in self.loaded:
            tensor = self.tensors[name]
            if parameter:
                from ember.nn.parameter import Parameter

                tensor = Parameter(tensor, requires_grad=requires_grad)
            elif requires_grad:
                tensor = tensor.requires_grad_(True)
            self.loaded[key] = tensor
        return self.loaded[key]
