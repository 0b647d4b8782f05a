"""Data types: the dtype objects, their numpy equivalents, and PyTorch's type-promotion rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ember.core.errors import DTypeError


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

    # the kind tests, asked for at every recorded op: plain attributes, set once (a property is a call each time)
    is_float: bool = field(init=False, repr=False)
    is_int: bool = field(init=False, repr=False)
    is_unsigned: bool = field(init=False, repr=False)
    is_bool: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_float", self.kind == "f")
        object.__setattr__(self, "is_int", self.kind in ("i", "u"))
        object.__setattr__(self, "is_unsigned", self.kind == "u")
        object.__setattr__(self, "is_bool", self.kind == "b")

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
DTYPES_BY_NAME.update(
    {"bool_": bool_, "float": float32, "double": float64, "half": float16, "long": int64, "int": int32}
)

# the native numpy dtypes (bfloat16 has none: numpy holds its bits as uint16)
DTYPES_BY_NUMPY: dict[np.dtype, DType] = {np.dtype(dtype.name if dtype is not bool_ else "bool"): dtype
                                          for dtype in ALL_DTYPES if dtype is not bfloat16}

DEFAULT_FLOAT = float32
DEFAULT_INT = int64
PYTHON_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)  # numbers that act as scalar operands


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
    raise DTypeError(f"unknown dtype {value!r}; valid dtypes are {valid}")


def from_numpy(dtype: np.dtype) -> DType:
    """The DType of a numpy array's dtype, or a DTypeError naming the numpy dtype."""
    found = DTYPES_BY_NUMPY.get(dtype)  # (a numpy dtype's `name` is computed at each read: the per-op path's cost)
    if found is not None:
        return found
    if dtype.name in DTYPES_BY_NAME:
        return DTYPES_BY_NAME[dtype.name]
    raise DTypeError(f"numpy dtype {dtype} has no ember equivalent; valid: {', '.join(d.name for d in ALL_DTYPES)}")


_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2}


def can_cast(from_: object, to: object) -> bool:
    """torch.can_cast: whether an op may write a `from_` result into a `to` tensor, i.e. the cast does not lower the
    category (bool < integer < float): float to int and int to bool are not allowed, narrowing within one is."""
    return _KIND_RANK[to_dtype(from_).kind] <= _KIND_RANK[to_dtype(to).kind]


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types: the smallest dtype both a and b convert to without losing their category.

    Where PyTorch leaves a pair undefined (uint16/32/64 with another integer type), ember follows numpy (the
    smallest signed type holding both); only uint64 with a signed type has no such type and raises a DTypeError."""
    if a is b:
        return a
    if _KIND_RANK[a.kind] != _KIND_RANK[b.kind]:
        return a if _KIND_RANK[a.kind] > _KIND_RANK[b.kind] else b
    if a.is_float:
        if a.itemsize == b.itemsize == 2:  # float16 with bfloat16: neither holds the other
            return float32
        return a if a.priority > b.priority else b
    if a.kind == b.kind:
        return a if a.itemsize > b.itemsize else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    if unsigned.itemsize >= 8:
        raise DTypeError(
            f"no integer dtype holds both {a.name} and {b.name} (PyTorch does not promote them either); "
            f"cast one of them first, e.g. .to(ember.int64) or .to(ember.float64)"
        )
    return {1: int16, 2: int32, 4: int64}[unsigned.itemsize]


def scalar_dtype(value: object) -> DType:
    """The category dtype of a Python scalar: bool, int64 or float32 (the default)."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return DEFAULT_INT
    if isinstance(value, (float, np.floating)):
        return DEFAULT_FLOAT
    raise DTypeError(f"expected a Python number (bool, int or float), got {type(value).__name__}")


def result_type(tensor_dtype: DType, scalar: object) -> DType:
    """torch.result_type(tensor, python_scalar): a scalar only lifts the category (bool < int < float)."""
    return combine_result_types((tensor_dtype,), (), (scalar_dtype(scalar),))


def combine_result_types(dimensioned: Sequence[DType], zero_dim: Sequence[DType], scalars: Sequence[DType]) -> DType:
    """torch.result_type over three groups of operands: tensors with dims, 0-d tensors, and Python numbers
    (given as their category dtype, see scalar_dtype). Dimensioned tensors decide the dtype; 0-d tensors and
    numbers only count when their category (bool < integer < float) is higher, 0-d tensors before numbers."""
    dimensioned_result = _promote_all(dimensioned)
    lower = _combine_categories(_promote_all(zero_dim), _promote_all(scalars))
    result = _combine_categories(dimensioned_result, lower)
    assert result is not None, "combine_result_types needs at least one operand"
    return result


def _promote_all(values: Sequence[DType]) -> DType | None:
    result = None
    for value in values:
        result = value if result is None else promote_types(result, value)
    return result


def _combine_categories(higher: DType | None, lower: DType | None) -> DType | None:
    if higher is None:
        return lower
    if lower is None or higher.is_float:
        return higher
    if higher.is_bool or lower.is_float:
        return promote_types(higher, lower)
    return higher


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
