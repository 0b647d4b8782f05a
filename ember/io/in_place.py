"""Memory-mapped disk tensors placed on a device whose memory is the host's, without copying their bytes."""

from __future__ import annotations

from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.tensor import Tensor
from ember.scheduler.buffers import Buffer
from ember.scheduler.devices import get_device


def mapped_in_place(tensor: Tensor, device: str) -> Tensor | None:
    """`tensor` (a realized disk tensor, a region of a file) as a tensor of `device` over the same file bytes, when
    the device's pool can use a file mapping as one of its buffers (`MemoryPool.map_in_place`: host memory, e.g.
    the c backend); None otherwise (then `tensor.to(device)` copies). The file's pages are read when a kernel first
    touches them, are shared with the page cache, and count once however many processes map them."""
    node = tensor.node
    buffer = node.buffer
    region = buffer.handle if buffer is not None and node.op is Op.BUFFER else None
    path, end = getattr(region, "path", None), getattr(region, "end", None)
    if region is None or path is None or end is None:
        return None
    target = get_device(device)
    nbytes = buffer.nbytes
    handle = target.pool.map_in_place(path, end - nbytes, nbytes)
    if handle is None:
        return None
    placed = Node(Op.BUFFER, (), None, node.shape, node.dtype, target.name)
    placed.buffer = Buffer(target, buffer.size, node.dtype, handle)
    return Tensor._from_node(placed)
