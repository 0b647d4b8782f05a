"""The exceptions a user of ember can meet, each naming what was wrong and what would be valid.

Each one is also the builtin class PyTorch raises for the same mistake, so code written for torch catches it:
torch raises RuntimeError for shape, dtype and bad-argument errors (ShapeError, DTypeError, ArgumentError),
IndexError for a dim out of range (AxisError). They keep ValueError/TypeError as a second base, which is what
Python code outside torch expects for a bad value or type.
"""

from __future__ import annotations


class EmberError(Exception):
    """Base class of ember's own errors."""


class ShapeError(EmberError, RuntimeError, ValueError):
    """Shapes that do not fit an op (broadcasting, reshape sizes, matmul inner dims, ...)."""


class DTypeError(EmberError, RuntimeError, TypeError):
    """A dtype an op does not accept."""


class AxisError(EmberError, IndexError):
    """A dim/axis out of range for a tensor's rank, or one an op cannot reduce (max over a zero-size dim)."""


class ArgumentError(EmberError, RuntimeError, ValueError):
    """An argument value an op does not accept: an unknown mode or reduce string, a repeated dim, no clamp bounds,
    a non-positive count, a random distribution with invalid parameters."""


class DeviceError(EmberError, RuntimeError):
    """Tensors on different devices, an unknown device, or a device that cannot run a kernel."""


class BackendUnavailable(EmberError, RuntimeError):
    """Raised by a backend's probe() when its driver, library or hardware is missing; the message says why."""


class CompileError(EmberError, RuntimeError):
    """A backend's compiler rejected generated source; the message includes the source and the compiler output."""


class OutOfMemoryError(EmberError, MemoryError):
    """A memory pool could not give the bytes asked for."""


class MemoryBudgetError(OutOfMemoryError):
    """A realize cannot fit `ember.memory_budget` even recomputing every intermediate; `needed` is the least budget
    that fits (bytes), `pool` the pool that ran out."""

    def __init__(self, message: str, budget: int, needed: int, pool: str) -> None:
        super().__init__(message)
        self.budget, self.needed, self.pool = budget, needed, pool


class AutogradError(EmberError, RuntimeError):
    """Misuse of autograd: backward without history, a missing gradient, an in-place change of a leaf needing grad."""


class CompileFallbackWarning(RuntimeWarning):
    """A device failed to build or launch a kernel as ember lowered it (a driver that cannot compile some vector
    form), so ember built it again with narrower vectors or none; the message names the device, kernel and error."""


class LinAlgError(EmberError, RuntimeError):
    """A linear-algebra routine met a matrix it cannot handle (a singular matrix where an inverse was asked)."""
