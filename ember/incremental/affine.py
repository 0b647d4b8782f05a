"""Integers affine in one parameter t (a decode step's position), for planning once for a range of positions: an
`Affine` is an int (its value at t = 0) that also knows its slope in t, and every decision taken on one (a
comparison, an equality, a test for zero) narrows the `Interval` of t over which that decision comes out the same.
Code run on them inside `tracing()` computes, with the values at t = 0, results affine in t that hold for every t
of the interval. Whatever is not affine (a product of two affine values, a division by a negative or affine number,
a conversion to a plain int, a bit operation, an operation with a float on its right) pins the interval to t = 0
alone: the result stays right, for that t only. A float on the left of an operation (`1.5 < x`) is computed by
float's own code on the value at t = 0 with nothing recorded: the planning code run on Affine values does integer
arithmetic only."""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

UNBOUNDED = 1 << 62


class Interval:
    """The values of t, low..high inclusive, for which every decision recorded so far comes out as at t = 0."""

    __slots__ = ("high", "low")

    def __init__(self) -> None:
        self.low, self.high = -UNBOUNDED, UNBOUNDED

    def positive(self, value: int, slope: int, outcome: bool) -> None:
        """Record that `value + slope * t > 0` is `outcome` (its value at t = 0) over the interval."""
        if slope == 0:
            return
        if outcome:  # value + slope * t >= 1
            if slope > 0:
                self.low = max(self.low, _ceiling_division(1 - value, slope))
            else:
                self.high = min(self.high, (value - 1) // -slope)
        elif slope > 0:  # value + slope * t <= 0
            self.high = min(self.high, -value // slope)
        else:
            self.low = max(self.low, _ceiling_division(value, -slope))

    def nonzero(self, value: int, slope: int) -> None:
        """Record that `value + slope * t == 0` comes out as at t = 0 over the interval."""
        if slope == 0:
            return
        if value == 0:
            self.pin()
            return
        if value % slope == 0:  # (else it is never 0)
            root = -value // slope
            if root > 0:
                self.high = min(self.high, root - 1)
            else:
                self.low = max(self.low, root + 1)

    def pin(self) -> None:
        """Only t = 0 holds (a decision that is not affine in t)."""
        self.low, self.high = max(self.low, 0), min(self.high, 0)

    @property
    def is_point(self) -> bool:
        return self.low >= self.high


TRACE: ContextVar[Interval | None] = ContextVar("ember_affine_trace", default=None)


@contextmanager
def tracing() -> Iterator[Interval]:
    """Record the decisions taken on `Affine` values in this block (in the calling thread) into a new Interval."""
    interval = Interval()
    token = TRACE.set(interval)
    try:
        yield interval
    finally:
        TRACE.reset(token)


def _record() -> Interval:
    interval = TRACE.get()
    if interval is None:
        raise RuntimeError("an Affine value was used outside affine.tracing()")
    return interval


def _ceiling_division(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def affine(value: int, slope: int) -> int:
    """`value + slope * t`: an Affine, or the plain int `value` when the slope is 0."""
    if slope == 0:
        return int(value) if type(value) is not int else value
    result = int.__new__(Affine, value)
    result.slope = slope
    return result


def parts(value: Any) -> tuple[int, int]:
    """(value at t = 0, slope) of an int or an Affine, without recording anything."""
    if type(value) is Affine:
        return int.__int__(value), value.slope
    return value, 0


def parts_of(value: Any) -> Any:
    """`value` (ints, Affines, or tuples of them) at t = 0, recording nothing: for decisions that change no
    result (where to store a value), which a family's graphs take once, at t = 0, for all its positions."""
    if type(value) is Affine:
        return int.__int__(value)
    if type(value) is tuple:
        return tuple(parts_of(item) for item in value)
    return value


def at(value: Any, t: int) -> int:
    """The value of an int or an Affine at `t`."""
    if type(value) is Affine:
        return int.__int__(value) + value.slope * t
    return value


def at_all(value: Any, t: int) -> Any:
    """`value` (an int, an Affine, or tuples and lists of them, or anything else: kept) at `t`."""
    if type(value) is Affine:
        return int.__int__(value) + value.slope * t
    if type(value) is tuple:
        return tuple(at_all(item, t) for item in value)
    if type(value) is list:
        return [at_all(item, t) for item in value]
    return value


def holds_affine(value: Any) -> bool:
    """Whether `value` is an Affine or tuples and lists holding one."""
    if type(value) is Affine:
        return True
    if type(value) in (tuple, list):
        return any(holds_affine(item) for item in value)
    return False


def _with_number(operation: Any, value: "Affine", other: Any) -> Any:
    """An operation with a number other than an int (a float): on the value at t = 0, pinning t."""
    if not isinstance(other, numbers.Number):
        return NotImplemented
    return operation(_pinned(value), other)


def _reflected_subtraction(value: int, other: Any) -> Any:
    return other - value


def _pinned(value: Any) -> int:
    if type(value) is Affine:
        _record().pin()
        return int.__int__(value)
    return value


class Affine(int):
    """value + slope * t, with the int value at t = 0 (see the module docstring). Made by `affine`."""

    slope: int

    def __add__(self, other: Any) -> Any:
        if not isinstance(other, int):
            return _with_number(operator.add, self, other)
        value, slope = parts(other)
        return affine(int.__int__(self) + value, self.slope + slope)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        if not isinstance(other, int):
            return _with_number(operator.sub, self, other)
        value, slope = parts(other)
        return affine(int.__int__(self) - value, self.slope - slope)

    def __rsub__(self, other: Any) -> Any:
        if not isinstance(other, int):
            return _with_number(_reflected_subtraction, self, other)
        value, slope = parts(other)
        return affine(value - int.__int__(self), slope - self.slope)

    def __neg__(self) -> Any:
        return affine(-int.__int__(self), -self.slope)

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        return self if self >= 0 else -self

    def __mul__(self, other: Any) -> Any:
        if not isinstance(other, int):
            return _with_number(operator.mul, self, other)
        value, slope = parts(other)
        if slope != 0:  # a product of two affine values is not affine
            _record().pin()
            return int.__int__(self) * value
        return affine(int.__int__(self) * value, self.slope * value)

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Any:
        if not isinstance(other, int):
            return _with_number(operator.floordiv, self, other)
        divisor = _pinned(other)
        value = int.__int__(self)
        if divisor > 0 and self.slope % divisor == 0:
            return affine(value // divisor, self.slope // divisor)
        if divisor > 0:  # the quotient is a constant for the t that keep the value within its multiples
            return self._within_multiple(divisor)
        _record().pin()
        return value // divisor

    def __mod__(self, other: Any) -> Any:
        if not isinstance(other, int):
            return _with_number(operator.mod, self, other)
        divisor = _pinned(other)
        value = int.__int__(self)
        if divisor > 0 and self.slope % divisor == 0:
            return value % divisor
        if divisor > 0:
            return self - divisor * self._within_multiple(divisor)
        _record().pin()
        return value % divisor

    def _within_multiple(self, divisor: int) -> int:
        """value // divisor at t = 0, recording that it is the same for every t of the interval."""
        value = int.__int__(self)
        quotient = value // divisor
        interval = _record()
        interval.positive(value - divisor * quotient + 1, self.slope, True)  # value >= divisor * quotient
        interval.positive(divisor * (quotient + 1) - value, -self.slope, True)  # value < divisor * (quotient + 1)
        return quotient

    def _compare(self, other: Any) -> tuple[int, int] | None:
        """(value, slope) of self - other, or None when other is no int (a float: compared at t = 0 by
        `_with_number`, pinning t)."""
        if not isinstance(other, int):
            return None
        value, slope = parts(other)
        return int.__int__(self) - value, self.slope - slope

    def __lt__(self, other: Any) -> Any:
        difference = self._compare(other)
        if difference is None:
            return _with_number(operator.lt, self, other)
        outcome = difference[0] < 0  # other - self > 0
        _record().positive(-difference[0], -difference[1], outcome)
        return outcome

    def __le__(self, other: Any) -> Any:
        difference = self._compare(other)
        if difference is None:
            return _with_number(operator.le, self, other)
        outcome = difference[0] <= 0  # other - self + 1 > 0
        _record().positive(1 - difference[0], -difference[1], outcome)
        return outcome

    def __gt__(self, other: Any) -> Any:
        difference = self._compare(other)
        if difference is None:
            return _with_number(operator.gt, self, other)
        outcome = difference[0] > 0
        _record().positive(difference[0], difference[1], outcome)
        return outcome

    def __ge__(self, other: Any) -> Any:
        difference = self._compare(other)
        if difference is None:
            return _with_number(operator.ge, self, other)
        outcome = difference[0] >= 0  # self - other + 1 > 0
        _record().positive(difference[0] + 1, difference[1], outcome)
        return outcome

    def __eq__(self, other: Any) -> Any:
        difference = self._compare(other)
        if difference is None:
            return _with_number(operator.eq, self, other)
        _record().nonzero(*difference)
        return difference[0] == 0

    def __ne__(self, other: Any) -> Any:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return int.__hash__(self)

    def __bool__(self) -> bool:
        _record().nonzero(int.__int__(self), self.slope)
        return int.__int__(self) != 0

    # a conversion to a plain int (an index, a range, a format) takes the value at t = 0: it pins t
    def __int__(self) -> int:
        return _pinned(self)

    def __index__(self) -> int:
        return _pinned(self)

    def __float__(self) -> float:
        return float(_pinned(self))

    def __repr__(self) -> str:
        return f"{int.__int__(self)}{self.slope:+}t"

    def __format__(self, spec: str) -> str:
        return format(_pinned(self), spec)

    # (int's attributes would give the value at t = 0 unrecorded)
    real = property(lambda self: _pinned(self))
    numerator = property(lambda self: _pinned(self))
    imag = property(lambda self: 0)
    denominator = property(lambda self: 1)


def _pinning(name: str) -> Any:
    operation = getattr(int, name)

    def pinned(self: Affine, *arguments: Any) -> Any:
        return operation(_pinned(self), *[_pinned(argument) for argument in arguments])

    pinned.__name__ = name
    return pinned


# every other int operation is not affine (or not worth it): it works on the value at t = 0 and pins t
for _name in ("__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lshift__", "__rlshift__",
              "__rshift__", "__rrshift__", "__pow__", "__rpow__", "__divmod__", "__rdivmod__", "__truediv__",
              "__rtruediv__", "__rfloordiv__", "__rmod__", "__invert__", "__round__", "__trunc__", "__floor__",
              "__ceil__", "bit_length", "bit_count", "to_bytes", "conjugate", "as_integer_ratio", "__getnewargs__",
              "__str__"):
    setattr(Affine, _name, _pinning(_name))
