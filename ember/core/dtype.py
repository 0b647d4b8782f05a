"""Data types: the dtype objects, their numpy equivalents, and PyTorch's type-promotion rules."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class DType:
    """A tensor element type. `kind` is 'b' (bool), 'i' (signed int), 'u' (unsigned int) or 'f' (float).

    Each dtype exists once (the module constants below), so equality and hashing are by identity (fast)."""

    name: str
    itemsize: int
    kind: str
    priority: int  # order within promotion: larger wins among the same kind

    def __repr__(self) -> str:
        return f"ember.{self.name}"

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in ("i", "u")

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "u"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype holding this type's bits (bfloat16 is held as uint16)."""
        return np.dtype("uint16") if self.name == "bfloat16" else np.dtype(self.name if self.name != "bool" else "bool")

    @property
    def bits(self) -> int:
        return self.itemsize * 8


bool_ = DType("bool", 1, "b", 0)
uint8 = DType("uint8", 1, "u", 1)
uint16 = DType("uint16", 2, "u", 2)
uint32 = DType("uint32", 4, "u", 3)
uint64 = DType("uint64", 8, "u", 4)
int8 = DType("int8", 1, "i", 1)
int16 = DType("int16", 2, "i", 2)
int32 = DType("int32", 4, "i", 3)
int64 = DType("int64", 8, "i", 4)
float16 = DType("float16", 2, "f", 1)
bfloat16 = DType("bfloat16", 2, "f", 1)
float32 = DType("float32", 4, "f", 2)
float64 = DType("float64", 8, "f", 3)

ALL_DTYPES: tuple[DType, ...] = (
    bool_, uint8, uint16, uint32, uint64, int8, int16, int32, int64, float16, bfloat16, float32, float64,
)
DTYPES_BY_NAME: dict[str, DType] = {dtype.name: dtype for dtype in ALL_DTYPES}
DTYPES_BY_NAME.update({"bool_": bool_, "float": float32, "double": float64, "half": float16, "long": int64, "int": int32})

DEFAULT_FLOAT = float32
DEFAULT_INT = int64


def to_dtype(value: object) -> DType:
    """Convert a DType, a name ('float32'), a numpy dtype, a torch dtype or a Python type to a DType."""
    if isinstance(value, DType):
        return value
    if value is bool:
        return bool_
    if value is int:
        return DEFAULT_INT
    if value is float:
        return DEFAULT_FLOAT
    name = str(value).replace("torch.", "").replace("ember.", "")
    if name in DTYPES_BY_NAME:
        return DTYPES_BY_NAME[name]
    try:
        numpy_name = np.dtype(value).name  # type: ignore[call-overload]
    except TypeError:
        numpy_name = ""
    if numpy_name in DTYPES_BY_NAME:
        return DTYPES_BY_NAME[numpy_name]
    valid = ", ".join(dtype.name for dtype in ALL_DTYPES)
    raise TypeError(f"unknown dtype {value!r}; valid dtypes are {valid}")


def from_numpy(dtype: np.dtype) -> DType:
    """The DType of a numpy array's dtype, or a TypeError naming the numpy dtype."""
    if dtype.name in DTYPES_BY_NAME:
        return DTYPES_BY_NAME[dtype.name]
    raise TypeError(f"numpy dtype {dtype} has no ember equivalent; valid: {', '.join(d.name for d in ALL_DTYPES)}")


_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2}


def promote_types(a: DType, b: DType) -> DType:
    """PyTorch's torch.promote_types for two tensor dtypes."""
    if a == b:
        return a
    if _KIND_RANK[a.kind] != _KIND_RANK[b.kind]:
        return a if _KIND_RANK[a.kind] > _KIND_RANK[b.kind] else b
    if a.is_float:
        if {a, b} == {float16, bfloat16}:
            return float32
        return a if a.priority > b.priority else b
    # integers
    if a.kind == b.kind:
        return a if a.itemsize > b.itemsize else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    if unsigned.itemsize >= 8:
        raise TypeError(f"promotion of {a.name} with {b.name} is not defined (as in PyTorch); cast one of them first")
    return {1: int16, 2: int32, 4: int64}[unsigned.itemsize]


def scalar_dtype(value: object) -> DType:
    """The category dtype of a Python scalar: bool, int64 or float32 (the default)."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return DEFAULT_INT
    if isinstance(value, (float, np.floating)):
        return DEFAULT_FLOAT
    raise TypeError(f"expected a Python number, got {type(value).__name__}")


def result_type(tensor_dtype: DType, scalar: object) -> DType:
    """torch.result_type(tensor, python_scalar): a scalar only lifts the category (bool < int < float)."""
    category = scalar_dtype(scalar)
    if _KIND_RANK[category.kind] > _KIND_RANK[tensor_dtype.kind]:
        return category
    return tensor_dtype


def min_value(dtype: DType) -> float | int | bool:
    """The smallest value of a dtype (negative infinity for floats)."""
    if dtype.is_float:
        return float("-inf")
    if dtype.is_bool:
        return False
    return int(np.iinfo(dtype.numpy).min)


def max_value(dtype: DType) -> float | int | bool:
    """The largest value of a dtype (infinity for floats)."""
    if dtype.is_float:
        return float("inf")
    if dtype.is_bool:
        return True
    return int(np.iinfo(dtype.numpy).max)
