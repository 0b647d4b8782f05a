"""A disk cache of lowered kernels: the KernelIR that build_kernel_ir chose for a kernel and a device's capabilities.

Lowering with tile and vector plans costs ~0.1 s of Python per kernel (an MLP training step: 1.2 s), which a warm
start would pay again in every process. Entries are keyed by the kernel's structure, the capabilities the
transforms read, EMBER_NOOPT, and a digest of the source of the IR package and the op/dtype tables (so a change
to lowering never reuses an old entry). Entries are ember/cache.py's checked entries; one that fails its checks or
does not unpickle is deleted and the kernel lowered again, never trusted.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
from math import prod
from pathlib import Path
from typing import Any

from ember import cache
from ember.capabilities import DeviceInfo
from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.core.walk import post_order
from ember.ir.ir import IRNode, KernelIR
from ember.ir.kernel import Kernel
from ember.ir.packed_matmul import PackedMatmul


@functools.cache
def code_digest() -> str:
    """A digest of the code lowering depends on: ember/ir/*.py and the core op and dtype tables."""
    package = Path(__file__).resolve().parent
    files = sorted(package.glob("*.py")) + [package.parent / "core" / "ops.py", package.parent / "core" / "dtype.py"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def entry_path(kernel: Kernel, name: str, info: DeviceInfo, optimize: bool, variant: str = "") -> Path:
    """Where the lowering of `kernel` for these capabilities lives (`variant`: a plan other than the heuristic's)."""
    capabilities = (info.compute_units, info.preferred_vector_width, sorted(str(op) for op in info.vector_ops),
                    [(width, sorted(str(op) for op in ops)) for width, ops in info.fallback_vector_widths],
                    info.local_memory_bytes, info.max_local_size, info.max_global_size, info.warp_width,
                    sorted(dtype.name for dtype in info.matrix_dtypes), info.vector_registers, info.packed_matmul)
    parts = (code_digest(), name, repr(kernel), repr(capabilities), str(optimize))
    key = "\n".join(parts + ((variant,) if variant else ()))
    return cache.entry_path("ir", key)


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        # dtypes exist once and compare by identity: stored by name, loaded as the module's own object
        return ("dtype", obj.name) if isinstance(obj, dtypes.DType) else None


# the only globals an entry may name: ember's IR classes (an entry naming anything else, e.g. os.system, is refused
# before any of it runs: a planted entry with valid checksums still executes nothing)
ALLOWED_GLOBALS = frozenset({("ember.core.ops", "Op"), ("ember.ir.ir", "IROp"), ("ember.ir.ir", "BufferParam"),
                             ("builtins", "frozenset"), ("builtins", "set"), ("builtins", "complex")})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"a lowered-kernel cache entry names {module}.{name}, which is not one of "
                                         "ember's IR classes")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        kind, name = pid
        if kind != "dtype":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return dtypes.DTYPES_BY_NAME[name]


def _flatten(ir: KernelIR) -> tuple:
    """A KernelIR as flat tables (each node's sources by number, sources first): pickling the DAG itself would
    recurse as deep as the kernel's longest expression."""
    number: dict[int, int] = {}
    table: list[tuple] = []
    for node in post_order([ir.sink, *(node for group in ir.lane_groups for node in group)], lambda node: node.srcs):
        number[id(node)] = len(table)
        table.append((node.op, node.dtype, tuple(number[id(src)] for src in node.srcs), node.arg, node.minimum,
                      node.maximum, node.width))
    lane_groups = tuple(tuple(number[id(node)] for node in group) for group in ir.lane_groups)
    return (ir.name, ir.params, ir.global_size, ir.index_dtype, table, number[id(ir.sink)], lane_groups, ir.local_size,
            ir.warp_width, None if ir.packed is None else ir.packed.as_tuple())


def _unflatten(flat: tuple) -> KernelIR:
    name, params, global_size, index_dtype, table, sink, lane_groups, local_size, warp_width, packed = flat
    nodes: list[IRNode] = []
    for op, dtype, sources, arg, minimum, maximum, width in table:
        nodes.append(IRNode(op, dtype, tuple(nodes[source] for source in sources), arg, minimum, maximum, width))
    return KernelIR(name=name, params=params, global_size=global_size, sink=nodes[sink], index_dtype=index_dtype,
                    lane_groups=tuple(tuple(nodes[node] for node in group) for group in lane_groups),
                    local_size=local_size, warp_width=warp_width,
                    packed=None if packed is None else PackedMatmul.from_tuple(packed))


def load(path: Path, kernel: Kernel | None = None, name: str | None = None) -> KernelIR | None:
    """The cached KernelIR at path, or None (a missing, corrupt or unreadable entry, or one that is not the lowering
    of `kernel` named `name`: another kernel's IR; all but the first are deleted)."""
    payload = cache.read_entry(path)
    if payload is None:
        return None
    try:
        ir = _unflatten(_Unpickler(io.BytesIO(payload)).load())
        if kernel is not None and not fits(ir, kernel, name):
            raise ValueError("another kernel's IR")
        return ir
    except Exception:  # noqa: BLE001 - an entry that does not load is lowered again, never trusted
        cache.discard(path)
        return None


def fits(ir: KernelIR, kernel: Kernel, name: str | None) -> bool:
    """Whether a KernelIR can be the lowering of `kernel`: its name, and its parameters' sizes and input dtypes."""
    buffer_dtypes = {step.arg: step.dtype for step in kernel.steps if step.op is Op.BUFFER}
    sizes = (prod(kernel.output.shape), *kernel.input_sizes)
    return (isinstance(ir, KernelIR) and (name is None or ir.name == name) and len(ir.params) == len(sizes)
            and all(param.position == position and param.size == size and param.is_output == (position == 0)
                    for position, (param, size) in enumerate(zip(ir.params, sizes)))
            and all(buffer_dtypes.get(param.position) in (None, param.dtype) for param in ir.params[1:]))


def store(path: Path, ir: KernelIR) -> None:
    """Write an entry (atomically); a read-only cache is simply not written."""
    buffer = io.BytesIO()
    try:
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(_flatten(ir))
    except (pickle.PicklingError, TypeError, AttributeError):
        return
    cache.write_entry(path, buffer.getvalue())
