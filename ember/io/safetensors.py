"""Reading and writing the safetensors format (state dicts), with errors that name the file and what is wrong.

Layout: an 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]},
"__metadata__": {str: str}}, then the tensors' bytes (little-endian, row-major) with offsets relative to the end of
the header. The format is read and written here rather than through the safetensors package's numpy API because that
API cannot represent bfloat16 and its errors do not name the file; files are exchanged with the package in the tests.
Loading reads only the header: the tensors are memory-mapped `disk` tensors (ember assumes a little-endian host, as
the writer does).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from ember.core import dtype as dtypes
from ember.core.errors import EmberError
from ember.core.tensor import Tensor

DTYPE_CODES: dict[dtypes.DType, str] = {
    dtypes.bool_: "BOOL",
    dtypes.uint8: "U8",
    dtypes.int8: "I8",
    dtypes.uint16: "U16",
    dtypes.int16: "I16",
    dtypes.uint32: "U32",
    dtypes.int32: "I32",
    dtypes.uint64: "U64",
    dtypes.int64: "I64",
    dtypes.float16: "F16",
    dtypes.bfloat16: "BF16",
    dtypes.float32: "F32",
    dtypes.float64: "F64",
}
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}
MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(EmberError, RuntimeError, ValueError):
    """A file that is not valid safetensors (truncated, corrupt header, bad offsets, unknown dtype); a RuntimeError
    like torch.load's error for a corrupt file."""


def _raw_bytes(tensor: Tensor | np.ndarray) -> np.ndarray:
    """The tensor's values as a little-endian numpy array of its storage type (bfloat16 as its uint16 bits)."""
    if isinstance(tensor, np.ndarray):
        array = tensor
    elif tensor.dtype == dtypes.bfloat16:
        array = tensor.bitcast(dtypes.uint16).numpy()
    else:
        array = tensor.numpy()
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)


def save_safetensors(
    state_dict: Mapping[str, Tensor | np.ndarray], path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a state dict (name -> ember Tensor or numpy array) to `path` as safetensors; readable by
    `safetensors.torch.load_file`."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"save_safetensors: expected a mapping of names to tensors, got {type(state_dict).__name__}")
    header: dict[str, Any] = {}
    if metadata is not None:
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()):
            raise TypeError("save_safetensors: metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    arrays: list[np.ndarray] = []
    offset = 0
    realized = [tensor for tensor in state_dict.values() if isinstance(tensor, Tensor)]
    if realized:
        from ember.core.tensor import realize

        realize(*realized)
    for name, tensor in state_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"save_safetensors: keys must be strings, got {type(name).__name__}")
        if not isinstance(tensor, (Tensor, np.ndarray)):
            raise TypeError(
                f"save_safetensors: the value of {name!r} is a {type(tensor).__name__}, not an ember Tensor or a "
                "numpy array"
            )
        dtype = tensor.dtype if isinstance(tensor, Tensor) else dtypes.from_numpy(tensor.dtype)
        array = _raw_bytes(tensor)
        header[name] = {
            "dtype": DTYPE_CODES[dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        arrays.append(array)
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for array in arrays:
            file.write(array.tobytes())


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, str], int]:
    """(tensor entries, metadata, byte offset of the data) after checking the header against the file size."""
    name = os.fspath(path)
    try:
        size = os.path.getsize(name)
        with open(name, "rb") as file:
            prefix = file.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(
                    f"{name}: not a safetensors file: {size} bytes is too short for the 8-byte "
                    "header length (the file is empty or truncated)"
                )
            (header_length,) = struct.unpack("<Q", prefix)
            if header_length > MAX_HEADER_BYTES or 8 + header_length > size:
                raise SafetensorsError(
                    f"{name}: the header claims {header_length} bytes but the file has only "
                    f"{size} bytes (truncated, or not a safetensors file)"
                )
            raw_header = file.read(header_length)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such safetensors file: {name}") from None
    try:
        header = json.loads(raw_header.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsError(f"{name}: the header is not valid JSON ({error}); the file is corrupt") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{name}: the header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_length
    for key, entry in header.items():
        _check_entry(name, key, entry, size - data_start)
    return header, metadata, data_start


def _check_entry(name: str, key: str, entry: Any, data_size: int) -> None:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise SafetensorsError(
            f"{name}: the header entry of {key!r} needs dtype, shape and data_offsets, got {entry!r}"
        )
    if entry["dtype"] not in DTYPES_BY_CODE:
        raise SafetensorsError(
            f"{name}: tensor {key!r} has dtype {entry['dtype']!r}, which ember cannot load "
            f"(supported: {', '.join(DTYPES_BY_CODE)})"
        )
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(isinstance(size, int) and size >= 0 for size in shape):
        raise SafetensorsError(f"{name}: tensor {key!r} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(value, int) for value in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise SafetensorsError(f"{name}: tensor {key!r} has invalid data_offsets {offsets!r}")
    expected = int(np.prod(shape, dtype=np.int64)) * DTYPES_BY_CODE[entry["dtype"]].itemsize
    if offsets[1] - offsets[0] != expected:
        raise SafetensorsError(
            f"{name}: tensor {key!r} of dtype {entry['dtype']} and shape {tuple(shape)} needs "
            f"{expected} bytes but its data_offsets {offsets} span {offsets[1] - offsets[0]}"
        )
    if offsets[1] > data_size:
        raise SafetensorsError(
            f"{name}: tensor {key!r} ends at byte {offsets[1]} of the data, but the file holds only "
            f"{data_size} bytes of data (the file is truncated)"
        )


def load_safetensors(path: str | os.PathLike[str], device: Any = None) -> dict[str, Tensor]:
    """Every tensor of a safetensors file, lazily: only the header is read. With `device` None the tensors are
    memory-mapped `disk` tensors (their bytes are read when a kernel needs them); with a device, copies to it that
    are made when first used."""
    from ember.scheduler.buffers import mapped_node

    header, _, data_start = read_safetensors_header(path)
    name = os.fspath(path)
    result: dict[str, Tensor] = {}
    for key, entry in header.items():
        begin = entry["data_offsets"][0]
        node = mapped_node(name, data_start + begin, tuple(entry["shape"]), DTYPES_BY_CODE[entry["dtype"]])
        tensor = Tensor._from_node(node)
        result[key] = tensor if device is None else tensor.to(device)
    return result


def load_safetensors_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The `__metadata__` strings of a safetensors file (empty if it has none)."""
    return read_safetensors_header(path)[1]


# safetensors.torch's names, so that `from safetensors.torch import save_file, load_file` ports by changing only the
# import to `from ember.io import save_file, load_file` (safetensors.torch itself refuses ember tensors: its first
# check is isinstance(value, torch.Tensor), which nothing on an ember tensor can answer)

def save_file(tensors: Mapping[str, Tensor], filename: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None) -> None:
    """safetensors.torch.save_file for ember tensors: write name -> tensor to `filename` (readable by safetensors)."""
    save_safetensors(tensors, filename, metadata)


def load_file(filename: str | os.PathLike[str], device: Any = "cpu") -> dict[str, Tensor]:
    """safetensors.torch.load_file for ember: every tensor of the file on `device` ('cpu' is ember's c device)."""
    return load_safetensors(filename, device)


def save_model(model: Any, filename: str | os.PathLike[str], metadata: Mapping[str, str] | None = None,
               force_contiguous: bool = False) -> None:
    """safetensors.torch.save_model for an ember Module: its state dict to `filename` (ember's tensors are always
    contiguous values, so force_contiguous changes nothing)."""
    save_safetensors(model.state_dict(), filename, metadata)


def load_model(model: Any, filename: str | os.PathLike[str], strict: bool = True,
               device: Any = "cpu") -> tuple[list[str], list[str]]:
    """safetensors.torch.load_model for an ember Module: load the file's tensors into it; returns (missing,
    unexpected) key lists (with strict, a mismatch raises as load_state_dict does)."""
    result = model.load_state_dict(load_safetensors(filename, device), strict=strict)
    return list(result.missing_keys), list(result.unexpected_keys)
