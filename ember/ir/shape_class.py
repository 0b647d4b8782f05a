"""Shape classes: kernels alike but for some sizes (a generation loop's growing sequence length) share one compiled
kernel, those sizes read at launch (sizes: shapes, view arguments, pad amounts, integer constants). Here: a
kernel's sizes apart from its structure, the class two kernels of one structure make (which sizes vary), and a
member's values of the class's size variables."""

from __future__ import annotations

from typing import Any, NamedTuple

from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.core.shapes import prod
from ember.ir.kernel import Kernel, KernelStep

VARIABLE_BASE = 1 << 40  # SizeVariable k is this int + k: above every size a kernel has (kernels index with int64)
SIZE_ARGUMENT_OPS = (Op.RESHAPE, Op.EXPAND)  # ops whose arg is their shape
MINIMUM_VARIABLE_SIZE = 2  # a size 1 is lowered as no axis at all; a class's sizes are never 1 (nor 0)
FLOAT_OFFSET_TYPES = (dtypes.float32, dtypes.float64)  # float constants given as ints that may be variables
LARGEST_MEMBER = 2**31 - 1  # a member's element counts stay within int32 (the class's kernel indexes with int32)
Limits = tuple[int, int]  # the least and the largest value a variable in a size's place may take
SIZE_LIMITS: Limits = (MINIMUM_VARIABLE_SIZE, LARGEST_MEMBER)
# an offset (a shrink's bounds, a pad's amounts, an integer constant: a box's start, a causal prefix's length) is
# only added, compared or computed with, never an axis: a class's offsets take any value from 0
OFFSET_LIMITS: Limits = (0, LARGEST_MEMBER)
FLOAT_OFFSET_LIMITS: Limits = (0, 2**24)  # a float constant loaded as int32 and converted: exact on every backend


class SizeVariable(int):
    """Size variable `number` of a shape class, in the class's kernel. As an int it is a value no real size has, so
    lowering's decisions by comparing sizes (equal, 1, below 2) come out as for every member of the class; its
    arithmetic raises TypeError: lowering computes with it only as an IR node (lower.lower_shape_class), and a use
    it does not handle keeps the kernel out of classes rather than baking in a wrong number."""

    number: int

    def __new__(cls, number: int) -> SizeVariable:
        variable = super().__new__(cls, VARIABLE_BASE + number)
        variable.number = number
        return variable

    def _refused(self, *_: Any) -> Any:
        raise TypeError(f"arithmetic on size variable {self.number} of a shape class (lowered only as an IR node)")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __floordiv__ = __rfloordiv__ = _refused
    __mod__ = __rmod__ = __truediv__ = __rtruediv__ = __pow__ = __neg__ = __divmod__ = __rdivmod__ = _refused
    __lshift__ = __rshift__ = __and__ = __or__ = __xor__ = _refused

    def __repr__(self) -> str:
        return f"size{self.number}"


def split_sizes(kernel: Kernel) -> tuple[tuple, tuple[int, ...], tuple[Limits, ...]]:
    """(structure, sizes, limits) of a kernel: the sizes are every shape entry, every reshape/expand/shrink
    argument, every pad amount, every integer constant and every input's element count, in order; the structure is
    the rest (ops, sources, other arguments, dtypes, ranks); per size the values a variable in its place may take
    (SIZE_LIMITS for a size, OFFSET_LIMITS for an offset, FLOAT_OFFSET_LIMITS for a float constant given as an
    int)."""
    sizes: list[int] = []
    limits: list[Limits] = []
    structure = []

    def take(values: tuple[int, ...] | list[int], kind: Limits) -> None:
        sizes.extend(values)
        limits.extend([kind] * len(values))

    for step in kernel.steps:
        take(step.shape, SIZE_LIMITS)
        arg = step.arg
        if step.op in SIZE_ARGUMENT_OPS:
            take(arg, SIZE_LIMITS)
            arg = len(arg)
        elif step.op is Op.SHRINK:
            for start, end in arg:
                take((start, end), OFFSET_LIMITS)
            arg = len(arg)
        elif step.op is Op.PAD:
            for before, after in arg[0]:
                take((before, after), OFFSET_LIMITS)
            arg = (len(arg[0]), arg[1])
        elif integer_constant(step):
            take((arg,), OFFSET_LIMITS if step.dtype.is_int else FLOAT_OFFSET_LIMITS)
            arg = "integer"
        structure.append((step.op, step.srcs, arg, len(step.shape), step.dtype))
    take(kernel.input_sizes, SIZE_LIMITS)
    return (tuple(structure), len(kernel.input_sizes)), tuple(sizes), tuple(limits)


class ShapeClass(NamedTuple):
    """Which sizes of a structure are variables: per size, a fixed int or a SizeVariable; per size the values a
    variable in its place may take (split_sizes' limits: a size's or an offset's; a variable is never in places of
    two kinds)."""

    pattern: tuple[int, ...]
    variables: int
    limits: tuple[Limits, ...]

    def member_values(self, sizes: tuple[int, ...]) -> tuple[int, ...] | None:
        """The values of the size variables for a kernel of the class's structure with these sizes, or None where
        the kernel is not a member (a fixed size differs, one variable would take two values, a variable is outside
        its place's limits)."""
        values: list[int | None] = [None] * self.variables
        for wanted, size, (minimum, maximum) in zip(self.pattern, sizes, self.limits):
            if type(wanted) is int:
                if size != wanted:
                    return None
                continue
            number = wanted.number  # type: ignore[attr-defined]
            known = values[number]
            if known is None:
                if not minimum <= size <= maximum:
                    return None
                values[number] = size
            elif known != size:
                return None
        return tuple(values)  # type: ignore[arg-type]

    def widened(self, sizes: tuple[int, ...]) -> ShapeClass | None:
        """The class holding this class's members and a kernel of these sizes: a fixed size the kernel differs in
        becomes a variable, a variable the kernel gives two values splits (positions stay together where their
        place in this class, their new size and their kind (size or offset) agree); None where nothing changes or a
        value that would vary is outside its place's limits."""
        numbers: dict[tuple[Any, int, Limits], int] = {}
        pattern: list[int] = []
        for wanted, size, (minimum, maximum) in zip(self.pattern, sizes, self.limits):
            variable = type(wanted) is not int
            if not variable and wanted == size:
                pattern.append(wanted)
                continue
            if not minimum <= size <= maximum or (not variable and not minimum <= wanted <= maximum):
                return None
            label = (("variable", wanted.number) if variable else ("fixed", wanted),  # type: ignore[attr-defined]
                     size, (minimum, maximum))
            number = numbers.setdefault(label, len(numbers))
            pattern.append(SizeVariable(number))
        if len(numbers) <= self.variables and all(
                type(old) is int or old.number == new.number  # type: ignore[attr-defined]
                for old, new in zip(self.pattern, pattern)):
            return None
        return ShapeClass(tuple(pattern), len(numbers), self.limits)


def class_of(first: tuple[int, ...], second: tuple[int, ...], limits: tuple[Limits, ...]) -> ShapeClass | None:
    """The class two kernels of one structure with these sizes (and split_sizes' limits) make: sizes equal in both
    are fixed, the others variables (one per pair of values and kind, so sizes that vary together share one); None
    where they do not differ or a varying value is outside its place's limits in either."""
    return ShapeClass(first, 0, limits).widened(second)


def class_kernel(kernel: Kernel, shape_class: ShapeClass) -> Kernel:
    """A member kernel with the class's variables in place of its sizes (the kernel the class compiles)."""
    pattern = iter(shape_class.pattern)

    def take(count: int) -> tuple[int, ...]:
        return tuple(next(pattern) for _ in range(count))

    steps = []
    for step in kernel.steps:
        shape = take(len(step.shape))
        arg = step.arg
        if step.op in SIZE_ARGUMENT_OPS:
            arg = take(len(arg))
        elif step.op is Op.SHRINK:
            arg = tuple(take(2) for _ in arg)
        elif step.op is Op.PAD:
            arg = (tuple(take(2) for _ in arg[0]), arg[1])
        elif integer_constant(step):
            arg = take(1)[0]
        steps.append(KernelStep(step.op, step.srcs, arg, shape, step.dtype))
    return Kernel(tuple(steps), take(len(kernel.input_sizes)))


def integer_constant(step: KernelStep) -> bool:
    """Whether a step is an integer constant (its value one of the kernel's sizes: a last index, a count), or a
    float32/float64 constant given as an int (a restricted arange's start: incremental/restrict.py), which a class's
    kernel loads as int32 and converts as the constant would be."""
    return step.op is Op.CONST and type(step.arg) is int and (step.dtype.is_int or step.dtype in FLOAT_OFFSET_TYPES)


def fits_class(kernel: Kernel) -> bool:
    """Whether a member kernel's element counts stay within int32 indices."""
    largest = max((prod(kernel.output.shape), *kernel.input_sizes, *(prod(step.shape) for step in kernel.steps)),
                  default=0)
    return largest <= LARGEST_MEMBER


def global_size(kernel: Kernel, whole_rows: bool) -> int:
    """The work items of a member kernel in its class's kernel: one per output element, or per row of outputs
    where the class's kernel computes whole rows."""
    shape = kernel.output.shape
    return prod(shape[:-1]) if whole_rows and shape else prod(shape)
