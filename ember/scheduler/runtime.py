"""The scheduler's implementation of core's runtime interface (core/runtime.py), installed when ember is imported."""

from __future__ import annotations

from ember.core import runtime
from ember.core.dtype import DType
from ember.core.graph import Node
from ember.ir.flash_attention import attention_tiles
from ember.ir.group_reduce import group_stage_extents, stages_for_parallelism
from ember.ir.opt import optimizations_enabled
from ember.scheduler import devices
from ember.scheduler.buffers import read_node, write_node
from ember.scheduler.placement import device_of
from ember.scheduler.realize import realize_nodes
from ember.sharding.tensor import shard


class SchedulerRuntime(runtime.Runtime):
    """Core's calls go straight to the scheduler's functions (no wrapper on the per-op path)."""

    realize = staticmethod(realize_nodes)  # type: ignore[assignment]
    read = staticmethod(read_node)  # type: ignore[assignment]
    write = staticmethod(write_node)  # type: ignore[assignment]
    device_of = staticmethod(device_of)  # type: ignore[assignment]
    resolve_device = staticmethod(devices.resolve_device)  # type: ignore[assignment]
    default_device = staticmethod(devices.get_default_device)  # type: ignore[assignment]
    backend_device = staticmethod(devices.backend_device)  # type: ignore[assignment]
    shard = staticmethod(shard)  # type: ignore[assignment]

    @staticmethod
    def parallel_stages(node: Node, extent: int, outputs: int) -> bool:
        """Stages for a GPU's workgroups where optimizations are on (ir/group_reduce.py)."""
        if not optimizations_enabled():
            return False
        info = devices.get_device(device_of(node)).info
        return stages_for_parallelism(extent, outputs, node.dtype, info)

    @staticmethod
    def reduce_stages(node: Node, extent: int, outputs: int) -> list[int] | None:
        """Workgroup stages where the node's device has them and optimizations are on (ir/group_reduce.py)."""
        if not optimizations_enabled():
            return None
        info = devices.get_device(device_of(node)).info
        return group_stage_extents(extent, outputs, node.dtype, info)

    @staticmethod
    def fused_attention(node: Node, batches: int, length: int, source_length: int, head: int,
                        value_head: int) -> bool:
        """Where optimizations are on and the node's device has tiles for it (ir/flash_attention.py)."""
        if not optimizations_enabled():
            return False
        info = devices.get_device(device_of(node)).info
        return attention_tiles(batches, length, source_length, head, value_head, node.dtype, info) is not None

    @staticmethod
    def supports_dtype(device: str, dtype: DType) -> bool:
        return dtype in devices.get_device(device).info.supported_dtypes


def install() -> None:
    """Make the scheduler the runtime core calls (done once, by `import ember`)."""
    runtime.install(SchedulerRuntime())
