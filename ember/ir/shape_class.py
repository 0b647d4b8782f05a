"""Shape classes: kernels alike but for some sizes (a generation loop's growing sequence length) share one compiled
kernel, those sizes read at launch (sizes: shapes, view arguments, pad amounts, integer constants). Here: a
kernel's sizes apart from its structure, the class two kernels of one structure make (which sizes vary), and a
member's values of the class's size variables."""

from __future__ import annotations

from typing import Any, NamedTuple

from ember.core.ops import Op
from ember.core.shapes import prod
from ember.ir.kernel import Kernel, KernelStep

VARIABLE_BASE = 1 << 40  # SizeVariable k is this int + k: above every size a kernel has (kernels index with int64)
SIZE_ARGUMENT_OPS = (Op.RESHAPE, Op.EXPAND)  # ops whose arg is their shape
MINIMUM_VARIABLE_SIZE = 2  # a size 1 is lowered as no axis at all; a class's sizes are never 1 (nor 0)
LARGEST_MEMBER = 2**31 - 1  # a member's element counts stay within int32 (the class's kernel indexes with int32)


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


def split_sizes(kernel: Kernel) -> tuple[tuple, tuple[int, ...]]:
    """(structure, sizes) of a kernel: the sizes are every shape entry, every reshape/expand/shrink argument and
    every input's element count, in order; the structure is the rest (ops, sources, other arguments, dtypes, ranks)."""
    sizes: list[int] = []
    structure = []
    for step in kernel.steps:
        sizes.extend(step.shape)
        arg = step.arg
        if step.op in SIZE_ARGUMENT_OPS:
            sizes.extend(arg)
            arg = len(arg)
        elif step.op is Op.SHRINK:
            for start, end in arg:
                sizes.extend((start, end))
            arg = len(arg)
        elif step.op is Op.PAD:
            for before, after in arg[0]:
                sizes.extend((before, after))
            arg = (len(arg[0]), arg[1])
        elif integer_constant(step):
            sizes.append(arg)
            arg = "integer"
        structure.append((step.op, step.srcs, arg, len(step.shape), step.dtype))
    sizes.extend(kernel.input_sizes)
    return (tuple(structure), len(kernel.input_sizes)), tuple(sizes)


class ShapeClass(NamedTuple):
    """Which sizes of a structure are variables: per size, a fixed int or a SizeVariable."""

    pattern: tuple[int, ...]
    variables: int

    def member_values(self, sizes: tuple[int, ...]) -> tuple[int, ...] | None:
        """The values of the size variables for a kernel of the class's structure with these sizes, or None where
        the kernel is not a member (a fixed size differs, one variable would take two values, a variable is below
        MINIMUM_VARIABLE_SIZE)."""
        values: list[int | None] = [None] * self.variables
        for wanted, size in zip(self.pattern, sizes):
            if type(wanted) is int:
                if size != wanted:
                    return None
                continue
            number = wanted.number  # type: ignore[attr-defined]
            known = values[number]
            if known is None:
                if not MINIMUM_VARIABLE_SIZE <= size <= LARGEST_MEMBER:
                    return None
                values[number] = size
            elif known != size:
                return None
        return tuple(values)  # type: ignore[arg-type]

    def widened(self, sizes: tuple[int, ...]) -> ShapeClass | None:
        """The class holding this class's members and a kernel of these sizes: a fixed size the kernel differs in
        becomes a variable, a variable the kernel gives two values splits (positions stay together where both their
        place in this class and their new size agree); None where nothing changes or a size that would vary is
        below MINIMUM_VARIABLE_SIZE."""
        numbers: dict[tuple[Any, int], int] = {}
        pattern: list[int] = []
        for wanted, size in zip(self.pattern, sizes):
            variable = type(wanted) is not int
            if not variable and wanted == size:
                pattern.append(wanted)
                continue
            if size < MINIMUM_VARIABLE_SIZE or wanted < MINIMUM_VARIABLE_SIZE:
                return None
            label = (("variable", wanted.number) if variable else ("fixed", wanted), size)  # type: ignore[attr-defined]
            number = numbers.setdefault(label, len(numbers))
            pattern.append(SizeVariable(number))
        if len(numbers) <= self.variables and all(
                type(old) is int or old.number == new.number  # type: ignore[attr-defined]
                for old, new in zip(self.pattern, pattern)):
            return None
        return ShapeClass(tuple(pattern), len(numbers))


def class_of(first: tuple[int, ...], second: tuple[int, ...]) -> ShapeClass | None:
    """The class two kernels of one structure with these sizes make: sizes equal in both are fixed, the others
    variables (one per pair of values, so sizes that vary together share one); None where they do not differ or a
    varying size is below MINIMUM_VARIABLE_SIZE in either."""
    return ShapeClass(first, 0).widened(second)


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
    """Whether a step is an integer constant (its value one of the kernel's sizes: a last index, a count)."""
    return step.op is Op.CONST and type(step.arg) is int and step.dtype.is_int


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
