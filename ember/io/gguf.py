"""Reading GGUF files (llama.cpp's format) lazily: header, metadata and tensor infos; the tensors stay on disk.

Layout (little-endian): the magic b"GGUF", a uint32 version (2 or 3), uint64 tensor and metadata counts, the
metadata as (string key, uint32 value type, value), the tensor infos as (string name, uint32 number of dimensions,
uint64 dimensions innermost first, uint32 ggml type, uint64 offset), padding to `general.alignment` (32 when absent),
then the tensor data, each tensor at its offset from the start of the data. A string is a uint64 length and UTF-8
bytes; an array a uint32 element type, a uint64 count and the elements. Only the header is read when a file is
opened: tensors become memory-mapped `disk` tensors (quantized ones `QuantizedTensor`s over their raw blocks).
"""

from __future__ import annotations

import codecs
import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from ember.core import dtype as dtypes
from ember.core.tensor import Tensor
from ember.io.quantized import FORMATS_BY_NAME, MappedRows, QuantizedTensor

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMENSIONS = 4  # GGML_MAX_DIMS
VALIDATED_AT_ONCE = 1 << 16  # bytes of packed strings checked for UTF-8 at a time (PackedStrings)

# metadata value types: struct format of the scalars (8 = string and 9 = array are read separately)
SCALAR_FORMATS: dict[int, str] = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}
STRING_TYPE, ARRAY_TYPE = 8, 9
VALUE_TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32", 7: "BOOL",
                    8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}


@dataclass(frozen=True)
class GGMLType:
    """A ggml tensor type: its name, and how many elements a block of how many bytes holds."""

    name: str
    block_elements: int
    block_bytes: int


# ggml type ids (ggml.h) of every type whose layout is fixed-size blocks
GGML_TYPES: dict[int, GGMLType] = {
    type_id: GGMLType(name, elements, nbytes)
    for type_id, (name, elements, nbytes) in {
        0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
        7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
        12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
        24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
        30: ("BF16", 1, 2),
    }.items()
}
PLAIN_DTYPES: dict[str, dtypes.DType] = {
    "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16, "F64": dtypes.float64,
    "I8": dtypes.int8, "I16": dtypes.int16, "I32": dtypes.int32, "I64": dtypes.int64,
}


class GGUFError(ValueError):
    """A file that is not valid GGUF (bad magic or version, truncated, corrupt header, bad offsets, unknown type)."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor lies in a GGUF file. `shape` is row-major (GGUF's dimension list reversed)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass
class GGUFHeader:
    """Everything in a GGUF file but the tensor data."""

    path: str
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo] = field(default_factory=dict)
    alignment: int = DEFAULT_ALIGNMENT
    data_start: int = 0


class PackedStrings(Sequence[str]):
    """A GGUF array of strings kept as its UTF-8 bytes end to end (`data`) and where each string starts (`offsets`,
    one more than the strings: the last is the data's length): a tokenizer's 262,144 pieces in ~3 MB instead of
    ~30 MB of str objects. Indexing decodes one string; `encoded` gives its bytes."""

    __slots__ = ("data", "offsets")

    def __init__(self, data: bytes, offsets: np.ndarray) -> None:
        self.data, self.offsets = data, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[position] for position in range(*index.indices(len(self)))]
        return self.encoded(index).decode("utf-8")

    def encoded(self, index: int) -> bytes:
        """The UTF-8 bytes of string `index` (an IndexError outside the array)."""
        count = len(self)
        if not -count <= index < count:
            raise IndexError(f"index {index} is outside the {count} strings")
        index %= count
        return self.data[int(self.offsets[index]) : int(self.offsets[index + 1])]

    def with_strings(self, replacements: dict[int, str]) -> PackedStrings:
        """A copy with the strings at some indices replaced."""
        if not replacements:
            return self
        parts, lengths, start = [], np.diff(self.offsets), 0
        for index in sorted(replacements):
            parts += [self.data[start : int(self.offsets[index])], replacements[index].encode("utf-8")]
            lengths[index] = len(parts[-1])
            start = int(self.offsets[index + 1])
        parts.append(self.data[start:])
        return PackedStrings(b"".join(parts), _offsets(lengths))


def pack_strings(strings: Sequence[str]) -> PackedStrings:
    """Strings as PackedStrings."""
    encoded = [string.encode("utf-8") for string in strings]
    return PackedStrings(b"".join(encoded), _offsets(np.array([len(item) for item in encoded], dtype=np.int64)))


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """Where each of strings of these byte lengths starts when they lie end to end, and the end (int64)."""
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


class _Cursor:
    """Reads little-endian values from a buffer, raising a GGUFError that says what was being read where."""

    def __init__(self, path: str, buffer: Any, size: int) -> None:
        self.path, self.buffer, self.size, self.position = path, buffer, size, 0

    def take(self, nbytes: int, what: str) -> bytes:
        if nbytes < 0 or self.position + nbytes > self.size:
            raise GGUFError(
                f"{self.path}: reading {what} at byte {self.position} needs {nbytes} bytes, but the file has only "
                f"{self.size} bytes (the file is truncated or its header is corrupt)"
            )
        start = self.position
        self.position += nbytes
        return self.buffer[start : self.position]

    def scalar(self, code: str, what: str) -> Any:
        return struct.unpack("<" + code, self.take(struct.calcsize(code), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("Q", f"the length of {what}")
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: {what} at byte {self.position - length} is not valid UTF-8") from None

    def skip(self, value_type: int, what: str) -> None:
        """Step over a value without building it (a tokenizer's 262,144 strings: no Python objects made)."""
        if value_type in SCALAR_FORMATS:
            self.take(struct.calcsize(SCALAR_FORMATS[value_type]), what)
        elif value_type == STRING_TYPE:
            self.take(self.scalar("Q", f"the length of {what}"), what)
        elif value_type == ARRAY_TYPE:
            element_type = self.scalar("I", f"the element type of {what}")
            count = self.scalar("Q", f"the length of {what}")
            if element_type in SCALAR_FORMATS:
                self.take(count * struct.calcsize(SCALAR_FORMATS[element_type]), f"the {count} elements of {what}")
            elif element_type in (STRING_TYPE, ARRAY_TYPE):
                if count > self.size - self.position:
                    raise GGUFError(f"{self.path}: {what} claims {count} elements, more than the file's remaining "
                                    f"{self.size - self.position} bytes could hold (the header is corrupt)")
                for index in range(count):
                    self.skip(element_type, f"element {index} of {what}")
            else:
                raise GGUFError(f"{self.path}: {what} has an unknown array element type {element_type} "
                                f"({_valid_types()})")
        else:
            raise GGUFError(f"{self.path}: {what} has an unknown value type {value_type} ({_valid_types()})")

    def packed_strings(self, what: str) -> PackedStrings:
        """An array of strings as PackedStrings: its bytes copied once, no Python object a string; each string is
        valid UTF-8 (the bytes as a whole decode, and no string starts inside a character)."""
        value_type = self.scalar("I", f"the value type of {what}")
        element_type = self.scalar("I", f"the element type of {what}") if value_type == ARRAY_TYPE else -1
        if element_type != STRING_TYPE:
            raise GGUFError(f"{self.path}: {what} is not an array of strings")
        count = self.scalar("Q", f"the length of {what}")
        if count > (self.size - self.position) // 8:  # each string needs at least its 8-byte length
            raise GGUFError(f"{self.path}: {what} claims {count} strings, more than the file's remaining "
                            f"{self.size - self.position} bytes could hold (the header is corrupt)")
        first = self.position
        starts = np.empty(count, dtype=np.int64)  # of each string's bytes, relative to `first`
        unpack, buffer, position = struct.Struct("<Q").unpack_from, self.buffer, first
        for index in range(count):
            if position + 8 > self.size:
                raise GGUFError(f"{self.path}: reading the length of element {index} of {what} at byte {position} "
                                f"runs past the file's {self.size} bytes (the file is truncated)")
            starts[index] = position + 8 - first
            position += 8 + unpack(buffer, position)[0]
        raw = np.frombuffer(self.take(position - first, f"the {count} strings of {what}"), dtype=np.uint8)
        keep = np.ones(len(raw), dtype=bool)
        for byte in range(8):  # the lengths in front of the strings
            keep[starts - 8 + byte] = False
        lengths = np.diff(np.append(starts, len(raw) + 8)) - 8
        offsets = _offsets(lengths)
        data = raw[keep]
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:  # (in pieces: the whole as one str is up to 4 bytes a character)
            for start in range(0, len(data), VALIDATED_AT_ONCE):
                decoder.decode(data[start : start + VALIDATED_AT_ONCE].tobytes())
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as error:
            raise GGUFError(f"{self.path}: {what} holds bytes that are not UTF-8 ({error.reason})") from None
        split = offsets[:-1][(lengths > 0)]
        if np.any((data[split] & 0xC0) == 0x80):
            raise GGUFError(f"{self.path}: {what} has a string that starts inside a UTF-8 character")
        return PackedStrings(data.tobytes(), offsets)

    def value(self, value_type: int, what: str) -> Any:
        if value_type in SCALAR_FORMATS:
            return self.scalar(SCALAR_FORMATS[value_type], what)
        if value_type == STRING_TYPE:
            return self.string(what)
        if value_type == ARRAY_TYPE:
            element_type = self.scalar("I", f"the element type of {what}")
            count = self.scalar("Q", f"the length of {what}")
            if element_type in SCALAR_FORMATS:
                code = SCALAR_FORMATS[element_type]
                raw = self.take(count * struct.calcsize(code), f"the {count} elements of {what}")
                return np.frombuffer(raw, dtype=np.dtype("<" + code)).tolist()
            if element_type == STRING_TYPE:
                if count > self.size - self.position:  # each string needs at least its 8-byte length
                    raise GGUFError(
                        f"{self.path}: {what} claims {count} strings, more than the file's remaining "
                        f"{self.size - self.position} bytes could hold (the header is corrupt)"
                    )
                return [self.string(f"element {index} of {what}") for index in range(count)]
            if element_type == ARRAY_TYPE:
                return [self.value(ARRAY_TYPE, f"element {index} of {what}") for index in range(count)]
            raise GGUFError(f"{self.path}: {what} has an unknown array element type {element_type} ({_valid_types()})")
        raise GGUFError(f"{self.path}: {what} has an unknown value type {value_type} ({_valid_types()})")


def _valid_types() -> str:
    return "valid: " + ", ".join(f"{code} {name}" for code, name in VALUE_TYPE_NAMES.items())


def read_gguf_header(path: str | os.PathLike[str], skip_keys: tuple[str, ...] = (),
                     packed_keys: tuple[str, ...] = ()) -> GGUFHeader:
    """The version, metadata and tensor infos of a GGUF file, each tensor checked against the file's size. Metadata
    whose key starts with one of `skip_keys` is stepped over (checked for length, never built); an array of strings
    whose key is one of `packed_keys` is read as PackedStrings (a GGUFError where it is another type)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                raise GGUFError(f"{name}: not a GGUF file: it is empty")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return _parse_header(_Cursor(name, mapped, size), skip_keys, packed_keys)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such GGUF file: {name}") from None


def _parse_header(cursor: _Cursor, skip_keys: tuple[str, ...] = (), packed_keys: tuple[str, ...] = ()
                  ) -> GGUFHeader:
    name = cursor.path
    magic = cursor.take(4, "the magic bytes") if cursor.size >= 4 else b""
    if magic != MAGIC:
        raise GGUFError(f"{name}: not a GGUF file: it starts with {bytes(magic)[:4]!r}, not {MAGIC!r}")
    version = cursor.scalar("I", "the version")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(
            f"{name}: GGUF version {version} is not supported (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})"
        )
    tensor_count = cursor.scalar("Q", "the tensor count")
    metadata_count = cursor.scalar("Q", "the metadata count")
    metadata: dict[str, Any] = {}
    for index in range(metadata_count):
        key = cursor.string(f"the key of metadata entry {index}")
        if key in packed_keys:
            metadata[key] = cursor.packed_strings(f"metadata {key!r}")
            continue
        value_type = cursor.scalar("I", f"the value type of metadata {key!r}")
        if skip_keys and key.startswith(skip_keys):
            cursor.skip(value_type, f"metadata {key!r}")
        else:
            metadata[key] = cursor.value(value_type, f"metadata {key!r}")
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{name}: general.alignment is {alignment!r}; it must be a power of two")
    header = GGUFHeader(name, version, metadata, alignment=alignment)
    if tensor_count > cursor.size:
        raise GGUFError(f"{name}: the header claims {tensor_count} tensors, more than the file's {cursor.size} bytes "
                        "could describe (the header is corrupt)")
    infos, seen = [], set()
    for index in range(tensor_count):
        tensor_name = cursor.string(f"the name of tensor {index}")
        if tensor_name in seen:
            raise GGUFError(f"{name}: tensor {tensor_name!r} appears twice in the header")
        dimension_count = cursor.scalar("I", f"the number of dimensions of tensor {tensor_name!r}")
        if dimension_count > MAX_DIMENSIONS:
            raise GGUFError(f"{name}: tensor {tensor_name!r} has {dimension_count} dimensions; GGUF allows at most "
                            f"{MAX_DIMENSIONS}")
        dimensions = [cursor.scalar("Q", f"dimension {axis} of tensor {tensor_name!r}")
                      for axis in range(dimension_count)]
        type_id = cursor.scalar("I", f"the type of tensor {tensor_name!r}")
        offset = cursor.scalar("Q", f"the offset of tensor {tensor_name!r}")
        infos.append((tensor_name, dimensions, type_id, offset))
        seen.add(tensor_name)
    header.data_start = -(-cursor.position // alignment) * alignment
    data_size = cursor.size - header.data_start
    for tensor_name, dimensions, type_id, offset in infos:
        header.tensors[tensor_name] = _check_tensor(name, tensor_name, dimensions, type_id, offset, header, data_size)
    return header


def _check_tensor(
    name: str, tensor_name: str, dimensions: list[int], type_id: int, offset: int, header: GGUFHeader, data_size: int
) -> GGUFTensorInfo:
    ggml_type = GGML_TYPES.get(type_id)
    if ggml_type is None:
        raise GGUFError(
            f"{name}: tensor {tensor_name!r} has ggml type {type_id}, which ember does not know (known: "
            + ", ".join(f"{code} {known.name}" for code, known in GGML_TYPES.items()) + ")"
        )
    shape = tuple(reversed(dimensions))
    if shape and shape[-1] % ggml_type.block_elements:
        raise GGUFError(
            f"{name}: tensor {tensor_name!r} of type {ggml_type.name} has rows of {shape[-1]} elements, not a "
            f"multiple of its block of {ggml_type.block_elements}"
        )
    elements = int(np.prod(shape, dtype=object)) if shape else 1
    nbytes = elements // ggml_type.block_elements * ggml_type.block_bytes
    if offset % header.alignment:
        raise GGUFError(f"{name}: tensor {tensor_name!r} starts at data offset {offset}, which is not a multiple of "
                        f"the alignment {header.alignment}")
    if offset + nbytes > data_size:
        raise GGUFError(
            f"{name}: tensor {tensor_name!r} ({ggml_type.name}, shape {shape}) needs data bytes {offset}.."
            f"{offset + nbytes}, but the file holds only {max(data_size, 0)} bytes of data (the file is truncated or "
            "the offset is out of range)"
        )
    return GGUFTensorInfo(tensor_name, shape, ggml_type, header.data_start + offset, nbytes)


def load_gguf_tensor(header: GGUFHeader, tensor_name: str) -> Tensor | QuantizedTensor:
    """One tensor of a GGUF file as a memory-mapped disk tensor (a QuantizedTensor for block-quantized types)."""
    from ember.scheduler.buffers import mapped_node

    info = header.tensors[tensor_name]
    type_name = info.ggml_type.name
    if type_name in PLAIN_DTYPES:
        return Tensor._from_node(mapped_node(header.path, info.offset, info.shape, PLAIN_DTYPES[type_name]))
    if type_name not in FORMATS_BY_NAME:
        raise GGUFError(
            f"{header.path}: tensor {tensor_name!r} has type {type_name}, which ember cannot compute with (supported: "
            + ", ".join([*PLAIN_DTYPES, *FORMATS_BY_NAME]) + ")"
        )
    quant_format = FORMATS_BY_NAME[type_name]
    rows = info.shape[:-1] if info.shape else ()
    row_bytes = (info.shape[-1] if info.shape else 1) // quant_format.block_elements * quant_format.block_bytes
    raw = Tensor._from_node(mapped_node(header.path, info.offset, (*rows, row_bytes), dtypes.uint8))
    source = MappedRows(header.path, info.offset, row_bytes, info.shape[-1], quant_format) if len(rows) == 1 else None
    return QuantizedTensor(raw, quant_format, info.shape, source)


def load_gguf(path: str | os.PathLike[str]) -> dict[str, Tensor | QuantizedTensor]:
    """Every tensor of a GGUF file, lazily: memory-mapped disk tensors, read only when a kernel needs them."""
    header = read_gguf_header(path)
    return {tensor_name: load_gguf_tensor(header, tensor_name) for tensor_name in header.tensors}


def load_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata of a GGUF file (architecture, hyper-parameters, tokenizer)."""
    return read_gguf_header(path).metadata
