"""Tensors over memory that is already there: memory-mapped disk tensors placed on a device whose memory is the
host's, without copying their bytes, and regions of a realized tensor's buffer written in place."""

from __future__ import annotations

from ember.capture.arena import ArenaView, view_node
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.shapes import prod
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


def region_view(tensor: Tensor, start: int, shape: tuple[int, ...]) -> Tensor | None:
    """Elements [start, start + prod(shape)) of a realized tensor laid out as its own buffer, as a tensor of `shape`
    over the same memory (no copy): a kernel assigning it in place writes those elements of the buffer only (a
    decode step's slots of a key/value cache). None where the tensor is not a whole buffer or its device's pool
    makes no view at that offset (`MemoryPool.view_alignment`): the caller writes through the whole tensor then.
    After each write, `region_written` orders what reads the whole tensor after it."""
    node = tensor.node
    buffer = node.buffer if node.realized else None
    size = prod(shape)
    if buffer is None or buffer.size != node.size or not 0 <= start <= start + size <= buffer.size or size == 0:
        return None
    offset = start * buffer.dtype.itemsize
    alignment = buffer.pool.view_alignment
    if alignment <= 0 or offset % alignment:
        return None
    return Tensor._from_node(view_node(buffer, start, shape))


def region_written(whole: Tensor, region: Tensor) -> bool:
    """After an in-place write of `region_view(whole, ...)`: whether the write went into the region's memory (an
    assign whose kernel could not write in place leaves the view for a buffer of its own); if so, what reads or
    overwrites `whole` from now on waits for the write (as write_box does for an incremental update's views)."""
    buffer, view = whole.node.buffer, region.node.buffer
    if buffer is None or not isinstance(view, ArenaView) or view.arena is not buffer:
        return False
    buffer.add_user(view.event)
    buffer.event = view.event
    return True
