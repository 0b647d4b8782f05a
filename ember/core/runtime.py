"""The one interface core needs from what runs its graphs (realize, read, placement, device names); the scheduler
installs the implementation when `ember` is imported, so core imports nothing above it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from ember.core.dtype import DType
    from ember.core.graph import Node


class Runtime:
    """What the lazy graph asks of the code that executes it. `ember.scheduler.runtime.SchedulerRuntime` is the
    implementation (`install` puts it in `RUNTIME` when `ember` is imported); this base only says it is missing."""

    def realize(self, nodes: list[Node]) -> None:
        """Compute every unrealized node of `nodes` (each becomes a BUFFER leaf)."""
        raise _not_installed()

    def read(self, node: Node) -> np.ndarray:
        """The values of a realized node as a new numpy array of its shape."""
        raise _not_installed()

    def write(self, node: Node, array: np.ndarray) -> None:
        """Overwrite a realized node's values in place with host values (after the commands using them), so every
        tensor and every ember.jit replay reading its buffer sees the new values."""
        raise _not_installed()

    def device_of(self, node: Node) -> str:
        """The device an op node will run on (the placement rule; memoized in `node.device`)."""
        raise _not_installed()

    def resolve_device(self, device: Any) -> str:
        """The canonical name of a device ('opencl' -> 'opencl:0', None -> the default device)."""
        raise _not_installed()

    def default_device(self) -> str:
        raise _not_installed()

    def backend_device(self, backend: str, which: Any, caller: str) -> str:
        """The device `which` (None: the first) of a backend, as x.cuda() and x.cpu() want it."""
        raise _not_installed()

    def parallel_stages(self, node: Node, extent: int, outputs: int) -> bool:
        """Whether a reduce of `node` short enough for one primitive is recorded in stages anyway, for the
        workgroups of its device (few outputs on a GPU: ir/group_reduce.stages_for_parallelism)."""
        raise _not_installed()

    def reduce_stages(self, node: Node, extent: int, outputs: int) -> list[int] | None:
        """The elements each stage of a long reduce of `node` reduces per row where its device reduces rows by
        workgroups (a full reduction in two steps), or None for core's own short stages (core/staged_reduce.py)."""
        raise _not_installed()

    def fused_attention(self, node: Node, batches: int, length: int, source_length: int, head: int,
                        value_head: int) -> bool:
        """Whether an attention of `batches` x [length, head] queries (`node` one of them) over `source_length` keys
        with values of `value_head` is written as one fused graph, which the node's device lowers as one flash
        attention kernel (ir/flash_attention.py)."""
        raise _not_installed()

    def supports_dtype(self, device: str, dtype: DType) -> bool:
        """Whether kernels on `device` compute in `dtype` (WebGPU without shader-f64 has no float64)."""
        raise _not_installed()

    def shard(self, tensor: Any, devices: Sequence[str], dim: int) -> Any:
        """`tensor` split along `dim` across `devices` (a ShardedTensor)."""
        raise _not_installed()


def _not_installed() -> RuntimeError:
    return RuntimeError("ember.core has no runtime installed: `import ember` installs the scheduler's")


RUNTIME: Runtime = Runtime()


def install(runtime: Runtime) -> None:
    """Make `runtime` the one core calls (ember.scheduler.runtime does this when ember is imported)."""
    global RUNTIME
    RUNTIME = runtime
