"""Reference (input, output) pairs for `check_against`: the key layout, and reading it from safetensors, numpy .npz
files and in-memory dicts, with errors that name the file and the key.

The layout (one flat mapping of name -> array, the same in every format):

    [pair<k>/]input.<i>            positional input i (0, 1, ...) of pair k
    [pair<k>/]input.<name>         keyword input `name`
    [pair<k>/]output.<i>           output i (a tensor result is output.0; a tuple's items 0, 1, ...)
    [pair<k>/]output.<name>        output `name` (a dict result)
    [pair<k>/]layer.<module>       per-layer reference: the output of the module named `module` (its name in
                                   named_modules()); a tuple or dict output gives its first tensor
    [pair<k>/]layer.<module>@<n>   the same module's output at its n-th call (n = 1, 2, ...; the first call has no @)

Keys without a `pair<k>/` prefix are one pair (pair 0); a file either prefixes every key or none.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ember.core.errors import EmberError

PAIR_PREFIX = re.compile(r"^pair(\d+)/(.*)$")
KINDS = ("input", "output", "layer")


class CheckError(EmberError, ValueError):
    """Reference pairs that cannot be checked: a missing or corrupt file, a key outside the layout, a missing input
    or output, a model that cannot run on the inputs."""


@dataclass
class ReferencePair:
    """One saved call: its inputs, the reference outputs, and the per-layer references (may be empty)."""

    index: int
    args: list[np.ndarray] = field(default_factory=list)
    kwargs: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    layers: dict[str, np.ndarray] = field(default_factory=dict)
    bfloat16: set[str] = field(default_factory=set)  # input names ("0", "mask") whose file dtype was bfloat16


def as_array(value: Any, where: str) -> np.ndarray:
    """A numpy array of a numpy array, a torch tensor, an ember Tensor or a Python number/list."""
    from ember.core.tensor import Tensor

    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Tensor):
        return np.asarray(value.float().numpy() if value.dtype.name == "bfloat16" else value.numpy())
    if type(value).__module__.startswith("torch"):
        detached = value.detach().cpu()
        if str(detached.dtype) == "torch.bfloat16":
            detached = detached.float()
        return np.asarray(detached.numpy())
    try:
        return np.asarray(value)
    except Exception as error:  # noqa: BLE001 - any value numpy cannot take is the caller's mistake
        raise CheckError(f"{where}: a {type(value).__name__} is not an array, a tensor or a number ({error})") from None


def _is_tensor(value: Any) -> bool:
    from ember.core.tensor import Tensor

    return isinstance(value, (np.ndarray, Tensor)) or type(value).__module__.startswith("torch") and \
        hasattr(value, "detach")


def flatten_result(result: Any, prefix: str = "") -> dict[str, Any]:
    """A function's result as named tensors: a tensor is "0", a tuple or list's items "0", "1", ..., a dict's
    (or a Hugging Face ModelOutput's) values their keys; nested containers join names with "."; None is skipped."""
    if result is None:
        return {}
    if _is_tensor(result) or isinstance(result, (bool, int, float)):
        return {prefix or "0": result}
    if isinstance(result, Mapping):
        items = [(str(key), value) for key, value in result.items()]
    elif isinstance(result, (tuple, list)):
        items = [(str(position), value) for position, value in enumerate(result)]
    else:
        raise CheckError(f"a result of type {type(result).__name__} is not a tensor, a tuple, a list or a dict")
    named: dict[str, Any] = {}
    for key, value in items:
        named.update(flatten_result(value, f"{prefix}.{key}" if prefix else key))
    return named


def first_tensor(output: Any) -> Any:
    """A layer's value for per-layer references: its output if a tensor, else the first tensor of a tuple, list or
    dict output (Hugging Face layers return (hidden_states, attention weights, ...)); None if it has none."""
    if _is_tensor(output):
        return output
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, (tuple, list)) else ()
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def read_arrays(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], set[str]]:
    """Every array of a safetensors or .npz file by name, and the names stored as bfloat16 (read as float32)."""
    name = os.fspath(path)
    if not os.path.exists(name):
        raise CheckError(f"no such reference file: {name}")
    with open(name, "rb") as file:
        magic = file.read(4)
    if magic == b"PK\x03\x04" or name.endswith(".npz"):
        return _read_npz(name), set()
    return _read_safetensors(name)


def _read_npz(name: str) -> dict[str, np.ndarray]:
    try:
        with np.load(name, allow_pickle=False) as archive:
            return {key: np.asarray(archive[key]) for key in archive.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise CheckError(f"{name}: not a readable numpy .npz file ({error}); the file is corrupt or truncated") \
            from None


def _read_safetensors(name: str) -> tuple[dict[str, np.ndarray], set[str]]:
    from ember.io.safetensors import DTYPES_BY_CODE, SafetensorsError, read_safetensors_header

    try:
        header, _, data_start = read_safetensors_header(name)
    except SafetensorsError as error:
        raise CheckError(f"not a reference file (safetensors or .npz): {error}") from None
    arrays: dict[str, np.ndarray] = {}
    bfloat16: set[str] = set()
    with open(name, "rb") as file:
        for key, entry in header.items():
            dtype = DTYPES_BY_CODE[entry["dtype"]]
            begin, end = entry["data_offsets"]
            file.seek(data_start + begin)
            raw = np.frombuffer(file.read(end - begin), dtype=dtype.numpy.newbyteorder("<"))
            array = raw.reshape(entry["shape"])
            if dtype.name == "bfloat16":  # the high half of a float32's bits
                array = (array.astype(np.uint32) << 16).view(np.float32)
                bfloat16.add(key)
            arrays[key] = array.astype(array.dtype.newbyteorder("="))
    return arrays, bfloat16


def _split_key(key: str, where: str) -> tuple[int | None, str, str]:
    """(pair index or None, kind, name) of a key of the layout."""
    matched = PAIR_PREFIX.match(key)
    pair, rest = (int(matched.group(1)), matched.group(2)) if matched else (None, key)
    kind, dot, name = rest.partition(".")
    if kind not in KINDS or not dot or not name:
        raise CheckError(f"{where}: key {key!r} is not in the reference layout: expected [pair<k>/]input.<i or name>, "
                         "[pair<k>/]output.<i or name> or [pair<k>/]layer.<module name> (see ember.testing.pairs)")
    return pair, kind, name


def parse_pairs(arrays: Mapping[str, Any], where: str, bfloat16: frozenset[str] | set[str] = frozenset(),
                ) -> list[ReferencePair]:
    """The pairs of a flat mapping in the layout above, in pair order; raises CheckError naming what is wrong."""
    if not isinstance(arrays, Mapping):
        raise CheckError(f"{where}: expected a mapping of layout keys to arrays, got {type(arrays).__name__}")
    if not arrays:
        raise CheckError(f"{where}: holds no arrays (expected input.0, output.0, ...)")
    pairs: dict[int, ReferencePair] = {}
    prefixed = None
    for key, value in arrays.items():
        if not isinstance(key, str):
            raise CheckError(f"{where}: keys must be strings, got {key!r}")
        index, kind, name = _split_key(key, where)
        if prefixed is None:
            prefixed = index is not None
        elif prefixed != (index is not None):
            raise CheckError(f"{where}: key {key!r} mixes keys with and without a pair<k>/ prefix; prefix every key "
                             "or none (one pair)")
        pair = pairs.setdefault(index or 0, ReferencePair(index or 0))
        array = as_array(value, f"{where}: {key!r}")
        if kind == "input":
            pair.kwargs[name] = array  # positional ones move to args below
            if key in bfloat16:
                pair.bfloat16.add(name)
        elif kind == "output":
            pair.outputs[name] = array
        else:
            pair.layers[name] = array
    for pair in pairs.values():
        _positional_inputs(pair, where)
        if not pair.outputs:
            expected = _key(prefixed, pair, "output.0")
            raise CheckError(f"{where}: pair {pair.index} has no output (expected a key {expected})")
    return [pairs[index] for index in sorted(pairs)]


def _key(prefixed: bool | None, pair: ReferencePair, name: str) -> str:
    return f"pair{pair.index}/{name}" if prefixed else name


def _positional_inputs(pair: ReferencePair, where: str) -> None:
    """Move input.0, input.1, ... from kwargs to args, checking that they are numbered without a gap."""
    numbered = sorted(int(name) for name in pair.kwargs if name.isdigit())
    for expected, found in enumerate(numbered):
        if expected != found:
            raise CheckError(f"{where}: pair {pair.index} has input.{found} but no input.{expected} (positional "
                             "inputs are numbered 0, 1, ... without a gap)")
    pair.args = [pair.kwargs.pop(str(position)) for position in numbered]


def load_pairs(source: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[ReferencePair]:
    """The reference pairs of a file path (safetensors or .npz), a flat mapping, or a list of flat mappings (one per
    pair, keys without the pair<k>/ prefix)."""
    if isinstance(source, (str, os.PathLike)):
        arrays, bfloat16 = read_arrays(source)
        return parse_pairs(arrays, os.fspath(source), bfloat16)
    if isinstance(source, Mapping):
        return parse_pairs(source, "the reference dict")
    if isinstance(source, Sequence) and not isinstance(source, (bytes, str)):
        pairs: list[ReferencePair] = []
        for index, mapping in enumerate(source):
            (pair,) = _single(parse_pairs(mapping, f"reference pair {index}"), index)
            pair.index = index
            pairs.append(pair)
        if not pairs:
            raise CheckError("the list of reference pairs is empty")
        return pairs
    raise CheckError(f"reference pairs must be a file path, a dict or a list of dicts, got {type(source).__name__}")


def _single(pairs: list[ReferencePair], index: int) -> list[ReferencePair]:
    if len(pairs) != 1:
        raise CheckError(f"reference pair {index} of the list holds {len(pairs)} pairs; a list holds one pair per "
                         "dict (keys without a pair<k>/ prefix)")
    return pairs


def save_pairs(arrays: Mapping[str, np.ndarray], path: str | os.PathLike[str]) -> None:
    """Write a flat mapping of the layout to `path`: numpy .npz if the name ends in .npz, else safetensors."""
    if Path(path).suffix == ".npz":
        np.savez(path, **dict(arrays))  # type: ignore[arg-type]  # (numpy's stubs type the keywords as allow_pickle)
        return
    from ember.io.safetensors import save_safetensors

    save_safetensors(arrays, path)
