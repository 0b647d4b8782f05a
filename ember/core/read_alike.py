"""Values that a reduce and a comparison with the reduce's result read bit for bit alike (argmax's, a max pool's
indices and gradient, cummax's and cummin's indices, the gradient of amax, amin, max() and min(), sorting and the
order statistics).

A first-maximum search compares each value with the maximum of its row: the maximum is one kernel's reduce, the
comparison another kernel, and each kernel computes a lazy value again. A value with a transcendental in it is not
computed alike by every kernel: on c, one that gcc vectorizes calls libmvec's vector exp2, sin or log2, one it keeps
scalar calls libm's, and the two differ in the last bits (opencl's and wgpu's kernels differ too, more rarely). Then
no element equals the maximum and the search finds none: `x.exp().argmax(0)` returned the row count (64 of 64) for
183 of 480 float32 and float64 cases on c; a max pool's gradient went to no element of its window;
`x.exp().cummin(1).indices` held -1 (no position matched its own running minimum) in each of 20 cases on c; and the
gradient of `x.sin().amax(0)` was 0 in whole columns. Such a value is stored once (CONTIGUOUS), so that every kernel
reads the same bits; a buffer, a constant, a value stored already (CONTIGUOUS, COPY: always a kernel's output) and
views of them (movement ops) are read alike already, so that a value stored once is not stored again (a max pool's
positions and its gradient, which reads the pool's stored input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.core.ops import MOVEMENT_OPS, Op

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

READ_ALIKE = frozenset({Op.BUFFER, Op.CONST, Op.CONTIGUOUS, Op.COPY})  # values every kernel reads from one place


def read_alike(tensor: Tensor) -> Tensor:
    """`tensor` where every kernel reading it reads the same values (see the module's docstring), else its values
    stored once: a float value computed from others (a graph that may be computed again and differently in two
    kernels). The result carries `tensor`'s gradient (CONTIGUOUS passes it back)."""
    node = getattr(tensor, "node", None)  # (the numpy reference tensor and sharded ones: their values are arrays)
    if node is None or not tensor.dtype.is_float:  # (integers and bools are computed exactly: alike in every kernel)
        return tensor
    while node.op in MOVEMENT_OPS:
        node = node.srcs[0]
    if node.op in READ_ALIKE:
        return tensor
    return tensor.contiguous()
