"""Coalesced collectives: several tensors of one dtype and device flattened into one buffer, exchanged in a single
collective (what DistributedDataParallel's buckets and its start-up broadcast use)."""

from __future__ import annotations

from collections.abc import Sequence

from ember.autograd.grad_mode import no_grad
from ember.core.movement import cat
from ember.core.tensor import Tensor, realize
from ember.distributed import communication
from ember.distributed.collectives import HALF_TYPES, exchange
from ember.distributed.process_group import DistributedError, check_group
from ember.distributed.reduce_op import ReduceOp


def all_reduce_coalesced(tensors: Sequence[Tensor], op: ReduceOp = ReduceOp.SUM) -> list[Tensor]:
    """The all_reduce of each tensor (op over the ranks), in one collective: new tensors (views of one flat result;
    float16 and bfloat16 are reduced in float32 and cast back); the given tensors are left as they are."""
    joined = check_group(None, "all_reduce_coalesced")
    dtype = _common_dtype(tensors, "all_reduce_coalesced")
    with no_grad():
        flat = _flat(tensors)
        staged = flat.float() if dtype in HALF_TYPES else flat
        reduction = communication.check_reduction(op, staged.dtype.numpy, "all_reduce_coalesced")
        reduced = exchange(lambda values: communication.all_reduce_array(joined, values[0], reduction), [staged],
                           staged.shape, staged.dtype)
        if reduced.dtype != dtype:
            reduced = reduced.to(dtype)
        return _pieces(reduced, tensors)


def broadcast_coalesced(tensors: Sequence[Tensor], src: int = 0) -> None:
    """Broadcast each tensor from rank `src` in one collective (tensors of one dtype and device), in place."""
    joined = check_group(None, "broadcast_coalesced")
    _common_dtype(tensors, "broadcast_coalesced")
    if not 0 <= src < joined.size:
        raise DistributedError(f"broadcast_coalesced: src={src} is not a rank; ranks are 0 .. {joined.size - 1}")
    with no_grad():
        flat = _flat(tensors)
        received = exchange(lambda values: communication.broadcast_array(joined, values[0], src), [flat], flat.shape,
                            flat.dtype)
        for tensor, piece in zip(tensors, _pieces(received, tensors)):
            tensor.assign(piece)
    realize(*tensors)


def _common_dtype(tensors: Sequence[Tensor], function: str) -> object:
    if not tensors:
        raise DistributedError(f"{function}: give at least one tensor")
    first = tensors[0]
    for tensor in tensors:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{function}: the tensors must be ember Tensors, got {type(tensor).__name__}")
        if tensor.dtype != first.dtype or tensor.device != first.device:
            raise DistributedError(f"{function}: the tensors must share one dtype and device, got {first.dtype.name} "
                                   f"on {first.device} and {tensor.dtype.name} on {tensor.device}")
    return first.dtype


def _flat(tensors: Sequence[Tensor]) -> Tensor:
    pieces = [tensor.detach().reshape(-1) for tensor in tensors]
    return pieces[0] if len(pieces) == 1 else cat(pieces)


def _pieces(flat: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    """The flat tensor cut into pieces of the shapes of `like`, in order (views: no copies)."""
    pieces, offset = [], 0
    for tensor in like:
        count = tensor.numel()
        pieces.append(flat[offset:offset + count].reshape(tensor.shape))
        offset += count
    return pieces
