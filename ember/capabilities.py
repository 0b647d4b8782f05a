"""What a device can do (DeviceInfo) and the launch geometry that follows from it; imports no ir and no backend."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.core import dtype as dtypes
from ember.core.dtype import DType


@dataclass
class DeviceInfo:
    """What a device can do; the scheduler and the optimizer read it, backends carry no optimizers of their own."""

    compute_units: int = 1
    max_global_size: int = 2**31 - 1
    max_local_size: int = 1
    local_memory_bytes: int = 0
    # work items a compute unit runs in lockstep (a GPU's warp or wavefront); 1 where there are none or they are not
    # known (a CPU, lavapipe included: its work groups' barriers are costly). Workgroup reductions (ir/group_reduce.py)
    # are made only for devices with warps
    warp_width: int = 1
    preferred_vector_width: int = 1  # float32 lanes of the device's vectors (so vectors have 4 * this bytes)
    # vector registers of a compute unit (x86: 16 with AVX2, 32 with AVX-512): how many accumulators a register
    # tile may hold (ir/opt.py) whatever the width its vectors are lowered at
    vector_registers: int = 16
    # the device computes on this machine's CPU cores (the c backend, an OpenCL CPU device such as PoCL, a CPU
    # WebGPU adapter such as lavapipe): two such devices share the cores, so splitting work between them gains
    # nothing (sharding/decision.py never does)
    host_cores: bool = False
    # loop iterations a work item may run in all, where the device ends longer ones (wgpu on Mesa's llvmpipe: 65,535,
    # wgpu.py's loop_limit); None: no limit. Plans that loop over a whole row keep within it (ir/opt.long_row_loop)
    max_loop_iterations: int | None = None
    # the renderer runs a plain float32 matmul as packed panels and a register-tiled micro-kernel with its
    # accumulators in vector registers (ir/packed_matmul.py; the c backend's backends/c_matmul.py)
    packed_matmul: bool = False
    vector_ops: frozenset[Any] = frozenset()  # IR ops the renderer applies to vectors (ir/vectorize.py); empty: none
    # narrower vector widths (float32 lanes, widest first), each with the IR ops usable at it, for kernels needing an
    # op `vector_ops` lacks, and for a kernel the device failed to build (a driver that cannot compile some vector
    # forms, found by probing: see opencl_probe.py); empty: the preferred width serves every op in vector_ops
    fallback_vector_widths: tuple[tuple[int, frozenset[Any]], ...] = ()
    supported_dtypes: frozenset[DType] = frozenset(dtypes.ALL_DTYPES)
    # input dtypes the device's matrix units (tensor cores) multiply a warp at a time, accumulating in float32
    # (PTX's mma.sync m16n8k16, sm_80 and newer: ir/group_matmul.py); empty: none
    matrix_dtypes: frozenset[DType] = frozenset()
    has_native_exp2: bool = True
    # bytes multiplied and summed into int32 faster than converted to floats (x86 VNNI, Arm's dot product): products
    # of quantized weights with a few rows of input then quantize the input to int8 (ember/io/quantized_dot.py)
    integer_dot_products: bool = False
    can_run: bool = True  # False for render-only (dummy) devices
    concurrent_compile: bool = False  # compile() may run in several threads at once (the C compiler may)
    max_kernel_buffers: int = 2**31 - 1  # buffers one kernel may bind, its output included (WebGPU: a few dozen)
    # bytes of the largest buffer the device holds (WebGPU: the adapter's storage binding size, 128 MB on lavapipe);
    # a larger tensor raises DeviceError naming the limit
    max_buffer_bytes: int = 2**63 - 1
    # a kernel's output may be the buffer of one of its inputs (an in-place update reading each element at its own
    # index; WebGPU: no, a buffer bound read-write in a dispatch cannot also be bound read-only)
    output_may_alias_input: bool = True
    # launch geometry (see launch_geometry): work items per group at most, work groups per compute unit at least
    # (smaller groups are used to reach it; 0: never), and work groups per dimension of a launch at most
    preferred_local_size: int = 1
    min_groups_per_unit: int = 0
    max_groups_per_dimension: int = 2**31 - 1
    extra: dict[str, Any] = field(default_factory=dict)

    def unsupported(self, used: set[DType]) -> list[DType]:
        return sorted((d for d in used if d not in self.supported_dtypes), key=lambda d: d.name)


def work_group_counts(global_size: int, local_size: int, max_per_dimension: int) -> tuple[int, int, int]:
    """Work groups along x, y, z covering `global_size` items in groups of `local_size` (at least one group): one
    dimension while it holds them, else rows of `max_per_dimension` groups (kernels then compute their id from x
    and y, and the items past `global_size` return at once)."""
    groups = max(1, -(-global_size // local_size))
    if groups <= max_per_dimension:
        return groups, 1, 1
    return max_per_dimension, -(-groups // max_per_dimension), 1


def launch_geometry(global_size: int, info: DeviceInfo, largest_local_size: int | None = None,
                    exact_local_size: int | None = None) -> tuple[tuple[int, int, int], int]:
    """(work groups along x, y, z; work items per group) for a kernel of `global_size` work items on a device.

    Groups are `info.preferred_local_size` items (at most `largest_local_size`, a kernel's own limit), halved while
    there are fewer than `info.min_groups_per_unit` groups per compute unit (a CPU driver runs a group on one core:
    a tiled matmul of 64 items in one group of 32 would leave other cores idle). Powers of two when the preferred
    size is one: on PoCL each local size is one more compile. Every backend that launches groups uses this.
    A workgroup kernel (KernelIR.local_size, `exact_local_size`) is launched in groups of exactly its size.
    """
    if exact_local_size is not None:
        return work_group_counts(global_size, exact_local_size, info.max_groups_per_dimension), exact_local_size
    size = max(1, info.preferred_local_size if largest_local_size is None
               else min(info.preferred_local_size, largest_local_size))
    while size > 1 and -(-global_size // size) < info.min_groups_per_unit * info.compute_units:
        size //= 2
    return work_group_counts(global_size, size, info.max_groups_per_dimension), size


@functools.cache
def host_cpu_field(name: str) -> str | None:
    """The first `name` line's value in /proc/cpuinfo ("model name", "flags"), or None where the OS gives none: what
    the host CPU says of itself, for keys of things that depend on it (compiled kernels, search winners)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
