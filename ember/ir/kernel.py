"""What the scheduler hands to lowering: a kernel as a flat, hashable list of primitive steps."""

from __future__ import annotations

from typing import Any, NamedTuple

from ember.core.dtype import DType
from ember.core.ops import Op


class KernelStep(NamedTuple):
    """One primitive op inside a kernel. `srcs` are positions of earlier steps; a BUFFER's arg is its parameter.

    A float CONST holds its value as `float.hex()` text, so that -0.0 and NaN are told apart in cache keys."""

    op: Op
    srcs: tuple[int, ...]
    arg: Any
    shape: tuple[int, ...]
    dtype: DType


class Kernel(NamedTuple):
    """The steps of one kernel (the last one is stored to parameter 0) and the sizes of its input parameters."""

    steps: tuple[KernelStep, ...]
    input_sizes: tuple[int, ...]  # element counts of parameters 1..n

    @property
    def output(self) -> KernelStep:
        return self.steps[-1]
